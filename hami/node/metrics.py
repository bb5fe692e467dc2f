"""Prometheus metrics of one node agent, in its own registry (several agents may share a
process in tests and demos)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hami.backends.base import Device


class NodeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
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

    def render(self) -> bytes:
        data: bytes = generate_latest(self.registry)
        return data
