"""What every nodetaskd process's metrics endpoint shows about the process itself, whatever its role."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector

from roles.common.version import package_version


def build_info() -> CollectorRegistry:
    """A registry of its own holding ``nodetaskd_build_info{version}`` (always 1), the usual way to tell
    which version each scraped process runs, and the process's standard ``process_*`` metrics (resident
    memory, CPU seconds, open and allowed file descriptors, start time). Kept out of the role's registry so
    that any number of endpoints may serve it."""
    registry = CollectorRegistry()
    info = Gauge(
        "nodetaskd_build_info", "The nodetaskd version this process runs (always 1).", ["version"], registry=registry
    )
    info.labels(version=package_version()).set(1)
    ProcessCollector(registry=registry)
    return registry


__all__ = ["build_info"]
