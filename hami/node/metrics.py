"""Prometheus metrics of one node agent, in its own registry (several agents may share a
process in tests and demos)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hami import buildinfo
from hami.backends.base import Device

if TYPE_CHECKING:
    from hami.node.monitor.service import Snapshot

# Go HAMi's vGPU monitor registers its collector under the constant label zone="vGPU";
# kept so that queries written for it match.
ZONE = "vGPU"
_HOST_LABELS = ["node", "device_index", "device_uuid", "device_type", "zone"]
_CTR_LABELS = ["namespace", "pod", "container", "vdevice_index", "device_uuid", "zone"]


class NodeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._usage: UsageCollector | None = None
        r = self.registry
        # As Go HAMi's vGPU monitor, the node side that serves its /metrics.
        buildinfo.register(r)
        self.devices = Gauge(
            "hami_node_devices",
            "Devices found by a backend, by health",
            ["backend", "type", "health"],
            registry=r,
        )
        self.registration_patches = Counter(
            "hami_node_registration_patches",
            "Node annotation patches written (register + handshake)",
            ["backend"],
            registry=r,
        )
        self.registration_failures = Counter(
            "hami_node_registration_failures",
            "Node annotation patches that failed",
            ["backend"],
            registry=r,
        )
        self.kubelet_registrations = Counter(
            "hami_node_kubelet_registrations",
            "Successful device plugin registrations with kubelet",
            ["resource"],
            registry=r,
        )
        self.allocate_calls = Counter(
            "hami_node_allocate_calls", "Allocate calls from kubelet", ["backend"], registry=r
        )
        self.allocate_errors = Counter(
            "hami_node_allocate_errors",
            "Allocate calls answered with an error",
            ["backend"],
            registry=r,
        )
        self.allocate_seconds = Histogram(
            "hami_node_allocate_seconds",
            "Time to answer an Allocate call",
            ["backend"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )

    def declare_backend(self, backend: str) -> None:
        """Export the backend's counters at 0 from the start: a series that appears only
        after its first event breaks rate() and alerts on the first failure."""
        for metric in (
            self.registration_patches,
            self.registration_failures,
            self.allocate_calls,
            self.allocate_errors,
            self.allocate_seconds,
        ):
            metric.labels(backend)

    def set_devices(self, backend: str, type_word: str, devices: Sequence[Device]) -> None:
        healthy = sum(1 for d in devices if d.healthy)
        self.devices.labels(backend, type_word, "healthy").set(healthy)
        self.devices.labels(backend, type_word, "unhealthy").set(len(devices) - healthy)

    def add_usage(self, node: str, snapshot: Callable[[], Snapshot]) -> None:
        """Export the usage monitor's latest pass (Go HAMi's node series); a second call
        (the agent run again) points the same collector at the new monitor."""
        if self._usage is None:
            self._usage = UsageCollector(node, snapshot)
            self.registry.register(self._usage)
        else:
            self._usage.node, self._usage.snapshot = node, snapshot

    def render(self) -> bytes:
        data: bytes = generate_latest(self.registry)
        return data


class UsageCollector(Collector):
    """Go HAMi's vGPU monitor families (names, help and labels as in its
    ``cmd/vGPUmonitor/metrics.go``), from the usage monitor's snapshot, plus the monitor's
    own health series."""

    def __init__(
        self, node: str, snapshot: Callable[[], Snapshot], wall: Callable[[], float] = time.time
    ) -> None:
        self.node = node
        self.snapshot = snapshot
        self.wall = wall

    def describe(self) -> list[Metric]:
        return []  # unchecked: the families are built per scrape

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        host_mem = GaugeMetricFamily(
            "hami_host_gpu_memory_used_bytes",
            "GPU device memory usage in bytes",
            labels=_HOST_LABELS,
        )
        host_util = GaugeMetricFamily(
            "hami_host_gpu_utilization_ratio",
            "GPU core utilization ratio (0-100)",
            labels=_HOST_LABELS,
        )
        host_mem_util = GaugeMetricFamily(
            "hami_host_gpu_memory_controller_utilization_ratio",
            "GPU memory controller utilization ratio (0-100)",
            labels=_HOST_LABELS[1:],  # Go HAMi has no node label on this one
        )
        for gpu in snap.hosts:
            labels = [self.node, str(gpu.index), gpu.uuid, gpu.device_type, ZONE]
            if gpu.memory_used is not None:
                host_mem.add_metric(labels, gpu.memory_used)
            if gpu.utilization is not None:
                host_util.add_metric(labels, gpu.utilization)
            if gpu.memory_utilization is not None:
                host_mem_util.add_metric(labels[1:], gpu.memory_utilization)
        yield from (host_mem, host_util, host_mem_util)

        def family(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=_CTR_LABELS)

        used = family("hami_vgpu_memory_used_bytes", "vGPU device memory usage in bytes")
        limit = family("hami_vgpu_memory_limit_bytes", "vGPU device memory limit in bytes")
        ctr_mem = family(
            "hami_container_device_memory_bytes", "Container device memory usage in bytes"
        )
        ctr_util = family(
            "hami_container_device_utilization_ratio", "Container device SM utilization ratio"
        )
        last_kernel = family(
            "hami_container_last_kernel_elapsed_seconds",
            "Seconds since last kernel execution in container",
        )
        context = family(
            "hami_vgpu_memory_context_bytes", "Container device memory context size in bytes"
        )
        module = family(
            "hami_vgpu_memory_module_bytes", "Container device memory module size in bytes"
        )
        buffer = family(
            "hami_vgpu_memory_buffer_bytes", "Container device memory buffer size in bytes"
        )
        now = int(self.wall())
        for usage in snap.containers:
            region = usage.region
            for dev in region.devices:
                labels = [
                    usage.pod.namespace,
                    usage.pod.name,
                    usage.container,
                    str(dev.index),
                    dev.uuid,
                    ZONE,
                ]
                used.add_metric(labels, dev.total)
                limit.add_metric(labels, dev.limit)
                ctr_mem.add_metric(labels, dev.total)
                ctr_util.add_metric(labels, dev.sm_util)
                context.add_metric(labels, dev.context)
                module.add_metric(labels, dev.module)
                buffer.add_metric(labels, dev.buffer)
                if region.last_kernel_time > 0:  # 0: no kernel yet, or a v0 region
                    last_kernel.add_metric(labels, max(now - region.last_kernel_time, 0))
        yield from (used, limit, ctr_mem, ctr_util, last_kernel, context, module, buffer)

        yield GaugeMetricFamily(
            "hami_node_monitor_containers",
            "Containers whose HAMi-core region the usage monitor read in its last pass",
            value=len(snap.containers),
        )
        yield GaugeMetricFamily(
            "hami_node_monitor_unreadable_regions",
            "Container directories whose region file could not be read in the last pass",
            value=snap.unreadable,
        )
        yield CounterMetricFamily(
            "hami_node_monitor_removed_dirs",
            "Directories of pods gone from the node removed by the usage monitor",
            value=snap.removed_total,
        )
