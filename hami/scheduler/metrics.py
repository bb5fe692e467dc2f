"""Prometheus metrics of the scheduler role, in a registry of its own (one per instance).

Device and availability gauges are read from the cluster state at scrape time, so they
cost nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from hami.core.cluster import Cluster

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StateCollector:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def collect(self) -> Iterator[Any]:
        labels = ["node", "type", "uuid", "model"]
        families = {
            name: GaugeMetricFamily(f"hami_device_{name}", text, labels=labels)
            for name, text in (
                ("memory_allocated_mib", "Device memory held by pods and reservations, MiB"),
                ("memory_total_mib", "Schedulable device memory, MiB"),
                ("cores_allocated_percent", "Device compute held, percent of one device"),
                ("cores_total_percent", "Schedulable device compute (0: no core limiter)"),
                ("slots_allocated", "Containers sharing the device"),
                ("slots_total", "Split count: containers that may share the device"),
                ("healthy", "1 when the node reports the device healthy"),
            )
        }
        for row in self.cluster.rows():
            d = row.device
            values = [row.node, row.type_word, d.uuid, d.model]
            families["memory_allocated_mib"].add_metric(values, d.used_memory)
            families["memory_total_mib"].add_metric(values, d.total_memory)
            families["cores_allocated_percent"].add_metric(values, d.used_cores)
            families["cores_total_percent"].add_metric(values, d.total_cores)
            families["slots_allocated"].add_metric(values, d.used)
            families["slots_total"].add_metric(values, d.count)
            families["healthy"].add_metric(values, 1 if d.healthy else 0)
        yield from families.values()
        available = GaugeMetricFamily(
            "hami_node_available",
            "1 when the node's device type passes the handshake and its register parses",
            labels=["node", "type"],
        )
        for node, type_word, ok in self.cluster.availability():
            available.add_metric([node, type_word], 1 if ok else 0)
        yield available
        pods = GaugeMetricFamily("hami_pods_holding_devices", "Pods (and reservations) counted")
        pods.add_metric([], len(self.cluster.pods))
        yield pods
        yield from self._quotas()

    def _quotas(self) -> Iterator[Any]:
        """Go HAMi's names and labels (dashboards carry over): ``quota_name`` is the
        resource (nvidia.com/gpumem), ``limit`` the limit as written in the ResourceQuota
        ("0" when none is set); used is in MiB or percent."""
        used = GaugeMetricFamily(
            "hami_resource_quota_used",
            "Device memory (MiB) or cores (percent) held by a namespace's pods",
            labels=["namespace", "quota_name", "limit"],
        )
        limit = GaugeMetricFamily(
            "hami_resource_quota_limit",
            "ResourceQuota limits.<resource> of a namespace, as written in the quota",
            labels=["namespace", "quota_name"],
        )
        for row in self.cluster.quotas.rows():
            name = row.resource.name
            used.add_metric([row.namespace, name, str(row.limit or 0)], row.used)
            if row.limit is not None:
                limit.add_metric([row.namespace, name], row.limit)
        yield used
        yield limit


class SchedulerMetrics:
    def __init__(self, cluster: Cluster) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StateCollector(cluster))
        self.filter_seconds = Histogram(
            "hami_filter_duration_seconds",
            "Time to answer an extender filter call, by outcome",
            ["outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "hami_filter_decision_seconds",
            "Time of the decision alone (no JSON, no API calls)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bind_seconds = Histogram(
            "hami_bind_duration_seconds",
            "Time to answer an extender bind call (lock wait included), by outcome",
            ["outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.filter_total = Counter(
            "hami_filter",
            "Filter calls by outcome: scheduled, unschedulable, passthrough, error",
            ["outcome"],
            registry=self.registry,
        )
        self.node_rejections = Counter(
            "hami_filter_node_rejections",
            "Nodes rejected by failing filter calls, by reason code",
            ["reason"],
            registry=self.registry,
        )
        self.bind_total = Counter(
            "hami_bind",
            "Bind calls by outcome (success, failed) and reason",
            ["outcome", "reason"],
            registry=self.registry,
        )
        self.availability_changes = Counter(
            "hami_node_availability_changes",
            "Times a node's device type became available or unavailable",
            ["type", "available"],
            registry=self.registry,
        )
        self.handshake_patches = Counter(
            "hami_handshake_patches",
            "Handshake patches by result: ok, conflict, error",
            ["result"],
            registry=self.registry,
        )
        self.annotation_errors = Counter(
            "hami_annotation_errors",
            "Malformed annotations found on nodes or pods",
            ["object"],
            registry=self.registry,
        )

        # Every known series exists at 0 from the start, so rate() and "increase > 0"
        # alerts work before the first event of each kind.
        for outcome in ("scheduled", "unschedulable", "passthrough", "error"):
            self.filter_total.labels(outcome)
            self.filter_seconds.labels(outcome)
        self.bind_total.labels("success", "bound")
        for reason in ("node_locked", "binding", "wrong_node", "error"):
            self.bind_total.labels("failed", reason)
        for outcome in ("success", "failed"):
            self.bind_seconds.labels(outcome)
        for result in ("ok", "conflict", "error"):
            self.handshake_patches.labels(result)
        for obj in ("node", "pod"):
            self.annotation_errors.labels(obj)

    def render(self) -> bytes:
        data: bytes = generate_latest(self.registry)
        return data
