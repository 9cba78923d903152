"""memengine's version, read from the metadata of the distribution that installed it (whatever its name)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, packages_distributions, version


@cache
def installed_version() -> str:
    """The version of the installed distribution that provides the ``memengine`` package, or ``"0+unknown"``."""
    for distribution in packages_distributions().get("memengine", []):
        try:
            return version(distribution)
        except PackageNotFoundError:  # pragma: no cover - metadata removed after the scan
            continue
    return "0+unknown"
