"""The distribution has a name of its own (``memengine`` on PyPI is another project), and every install hint uses it."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HINT = re.compile(r"pip install\s+['\"]?([A-Za-z0-9_.\-]+)(\[[^\]]*\])?")


def distribution_name() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]


def test_the_distribution_is_not_named_like_the_unrelated_pypi_project() -> None:
    assert distribution_name() == "agent-memengine"


def test_the_installed_distribution_provides_the_memengine_package() -> None:
    assert distribution_name() in packages_distributions()["memengine"]


def test_every_install_hint_names_this_distribution() -> None:
    wrong = []
    files = [ROOT / "README.md", *sorted((ROOT / "memengine").rglob("*.py")), *sorted((ROOT / "tests").glob("*.py"))]
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in HINT.finditer(line):
                name, extras = match.groups()
                foreign = "memengine" in name and name != distribution_name()
                if foreign or (extras and name not in (".", distribution_name())):
                    wrong.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
    assert not wrong, wrong


def test_extras_that_name_the_project_use_its_own_name() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for requirements in extras.values():
        for requirement in requirements:
            assert not requirement.startswith("memengine["), requirement


def test_the_version_is_read_without_scanning_every_installed_distribution(monkeypatch) -> None:
    """The first open_engine asks for it on the event loop: one metadata read, not all of them (56 ms here)."""
    from importlib.metadata import version

    from memengine import _version

    scans: list[str] = []
    monkeypatch.setattr(_version, "packages_distributions", lambda: scans.append("scan") or packages_distributions())
    _version.installed_version.cache_clear()
    try:
        assert _version.installed_version() == version(distribution_name())
        assert scans == []
        # Installed under another name: found by the scan.
        monkeypatch.setattr(_version, "DISTRIBUTION", "agent-memengine-renamed-copy")
        _version.installed_version.cache_clear()
        assert _version.installed_version() == version(distribution_name())
        assert scans == ["scan"]
    finally:
        _version.installed_version.cache_clear()
