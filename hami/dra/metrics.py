"""Prometheus series of the DRA mode's node side, in the node agent's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class DRAMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.registry = r
        self.prepares = Counter(
            "hami_dra_prepare",
            "Claims kubelet asked to prepare, by result: prepared, repeated (from the "
            "checkpoint) or error",
            ["driver", "result"],
            registry=r,
        )
        self.unprepares = Counter(
            "hami_dra_unprepare", "Claims kubelet asked to unprepare", ["driver"], registry=r
        )
        self.prepared_claims = Gauge(
            "hami_dra_prepared_claims",
            "Claims prepared and not yet unprepared",
            ["driver"],
            registry=r,
        )
        self.slice_writes = Counter(
            "hami_dra_slice_writes",
            "ResourceSlice creations and replacements (a changed device list)",
            ["driver"],
            registry=r,
        )
        self.slice_write_failures = Counter(
            "hami_dra_slice_write_failures",
            "Failed ResourceSlice reads or writes",
            ["driver"],
            registry=r,
        )
