"""``hami_build_info``: Go HAMi's build metadata gauge (pkg/metrics/metrics.go), on both
roles' ``/metrics``: the same name, help and label names, value 1.

The image sets ``HAMI_BUILD_REVISION`` and ``HAMI_BUILD_DATE`` (docker/Dockerfile's build
arguments, filled by the release workflow); elsewhere they are "unknown", as Go HAMi's are
in a build without ldflags. There is no Go toolchain here: ``go_version`` and ``compiler``
name the Python runtime instead, so that a query over Go HAMi's labels still matches.
"""

from __future__ import annotations

import os
import platform
import sys

from prometheus_client import CollectorRegistry, Gauge

from hami import __version__

NAME = "hami_build_info"
HELP = "hami build metadata exposed as labels with a constant value of 1."
# Go's runtime.GOARCH words for the machines the image is built for.
_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def labels() -> dict[str, str]:
    machine = platform.machine().lower()
    return {
        "version": __version__,
        "revision": os.environ.get("HAMI_BUILD_REVISION") or "unknown",
        "build_date": os.environ.get("HAMI_BUILD_DATE") or "unknown",
        "go_version": f"python{platform.python_version()}",
        "compiler": sys.implementation.name,
        "platform": f"{sys.platform}/{_GOARCH.get(machine, machine)}",
    }


def register(registry: CollectorRegistry) -> None:
    values = labels()
    Gauge(NAME, HELP, list(values), registry=registry).labels(**values).set(1)
