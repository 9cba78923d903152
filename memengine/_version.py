"""memengine's version, read from the metadata of the distribution that installed it (whatever its name)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, packages_distributions, version

#: The name memengine is published under (pyproject.toml): looked up first, a single metadata read.
DISTRIBUTION = "agent-memengine"


@cache
def installed_version() -> str:
    """The version of the installed distribution that provides the ``memengine`` package, or ``"0+unknown"``.

    Its own name is asked first: scanning every installed distribution (for a
    copy installed under another name) reads all their metadata, 60-300 ms in
    a large environment, and the first ``open_engine`` asks this on the event
    loop (telemetry's instrumentation scope).
    """
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        pass
    for distribution in packages_distributions().get("memengine", []):
        try:
            return version(distribution)
        except PackageNotFoundError:  # pragma: no cover - metadata removed after the scan
            continue
    return "0+unknown"
