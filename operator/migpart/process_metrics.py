"""What every migpart process exports besides its own metrics: `migpart_build_info` (which
build runs) and prometheus_client's process and Python runtime collectors
(`process_cpu_seconds_total`, `process_resident_memory_bytes`, `python_info`, ...).

The operator and the agent keep their own `CollectorRegistry` (several of them share one
process in tests and the demo), so these collectors are registered on that registry: the
global one, where prometheus_client puts them by default, is never served.
"""

from __future__ import annotations

import platform

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)

from migpart import __version__, revision


def build_labels() -> dict[str, str]:
    return {
        "version": __version__,
        "revision": revision(),
        "python_version": platform.python_version(),
    }


def register_process_metrics(registry: CollectorRegistry) -> None:
    """Add `migpart_build_info` (always 1) and the process, platform and garbage-collector
    collectors to `registry`."""
    labels = build_labels()
    info = Gauge(
        "migpart_build_info",
        "The running build: version, source revision and Python version (value always 1)",
        list(labels),
        registry=registry,
    )
    info.labels(**labels).set(1)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
