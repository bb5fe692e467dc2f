"""The scheduler's cluster gauges (hami.scheduler.metrics): Go HAMi's families with its
labels and units beside this project's, kept per node and per pod and re-rendered only
when the cluster reports a change, streamed in pieces that let the event loop run.

Pure logic on ``Cluster`` (no API server): the scrape over HTTP of a real scheduler role
is in test_metrics_dashboards.py."""

from __future__ import annotations

import asyncio
import gzip
from datetime import timedelta
from typing import Any

import pytest
from _core_helpers import NOW, NVIDIA, gpu, node, pod, register
from prometheus_client.parser import text_string_to_metric_families

from hami.core.cluster import Cluster
from hami.core.requests import parse_pod
from hami.protocol import ContainerDevice, encode_pod_devices
from hami.scheduler import metrics
from hami.scheduler.metrics import SchedulerMetrics

MIB = 1024 * 1024
MODEL = "NVIDIA-A100-SXM4-40GB"
# Go HAMi v2.10 cmd/scheduler/metrics.go: label names per family (zone from its registerer).
GO_LABELS = {
    "hami_gpu_memory_limit_bytes": {"node", "device_uuid", "device_index", "device_type"},
    "hami_gpu_core_limit_ratio": {"node", "device_uuid", "device_index", "device_type"},
    "hami_gpu_memory_allocated_bytes": {
        "node",
        "device_uuid",
        "device_index",
        "device_cores",
        "device_type",
    },
    "hami_gpu_shared_count": {"node", "device_uuid", "device_index", "device_type"},
    "hami_gpu_core_allocated_ratio": {"node", "device_uuid", "device_index", "device_type"},
    "hami_node_gpu_overview": {
        "node",
        "device_uuid",
        "device_index",
        "device_cores",
        "device_memory_limit",
        "device_type",
    },
    "hami_node_gpu_memory_allocated_ratio": {
        "node",
        "device_uuid",
        "device_index",
        "device_type",
    },
    "hami_vgpu_memory_allocated_bytes": {
        "namespace",
        "node",
        "pod",
        "container_index",
        "device_uuid",
    },
    "hami_vgpu_core_allocated_ratio": {
        "namespace",
        "node",
        "pod",
        "container_index",
        "device_uuid",
    },
}


def cluster() -> Cluster:
    return Cluster([NVIDIA], handshake_timeout=timedelta(seconds=60))


def running(name: str, node_name: str, devices: list[list[ContainerDevice]]) -> dict[str, Any]:
    return pod(
        *[gpu(f"c{i}") for i in range(len(devices))],
        name=name,
        namespace="team",
        uid=f"uid-{name}",
        node_name=node_name,
        phase="Running",
        annotations={
            "hami.io/vgpu-node": node_name,
            "hami.io/vgpu-devices-allocated": encode_pod_devices(devices),
            "hami.io/bind-phase": "success",
        },
    )


def samples(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    """family name -> (labels, value) of each sample, from the exposition as Prometheus
    reads it (the parser fails on anything malformed)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    matches = [v for have, v in found.get(name, []) if labels.items() <= have.items()]
    assert len(matches) == 1, (name, labels, found.get(name))
    return matches[0]


def two_nodes(c: Cluster) -> None:
    c.upsert_node(node("a", register(["GPU-a0", "GPU-a1"], memory=10000, model=MODEL)), NOW)
    c.upsert_node(node("b", register(["GPU-b0"], memory=20000, model=MODEL)), NOW)


def test_go_hami_families_have_its_labels_and_units_beside_ours() -> None:
    c = cluster()
    two_nodes(c)
    c.upsert_pod(
        running(
            "p",
            "a",
            [
                [ContainerDevice("GPU-a0", "NVIDIA", 3000, 30)],
                [],  # a container without devices keeps its index
                [ContainerDevice("GPU-a1", "NVIDIA", 2000, 0)],
            ],
        ),
        NOW,
    )
    text = SchedulerMetrics(c).render()
    found = samples(text)
    # Each sample sits under its own family's HELP/TYPE (else the parser calls it untyped).
    types = {f.name: f.type for f in text_string_to_metric_families(text.decode())}
    assert all(types[name] == "gauge" for name in GO_LABELS), types
    assert types["hami_device_memory_allocated_mib"] == "gauge"

    for name, labels in GO_LABELS.items():
        assert found.get(name), f"{name} missing"
        for have, _ in found[name]:
            assert set(have) == labels | {"zone"}, (name, have)
            assert have["zone"] == "vGPU"
    a0 = {"node": "a", "device_uuid": "GPU-a0", "device_index": "0", "device_type": MODEL}
    assert value(found, "hami_gpu_memory_limit_bytes", **a0) == 10000 * MIB
    assert value(found, "hami_gpu_memory_allocated_bytes", **a0, device_cores="100") == 3000 * MIB
    assert value(found, "hami_gpu_core_limit_ratio", **a0) == 100
    assert value(found, "hami_gpu_core_allocated_ratio", **a0) == 30
    assert value(found, "hami_gpu_shared_count", **a0) == 1
    assert value(found, "hami_node_gpu_memory_allocated_ratio", **a0) == pytest.approx(0.3)
    overview = {**a0, "device_cores": "100", "device_memory_limit": "10000"}
    assert value(found, "hami_node_gpu_overview", **overview) == 3000 * MIB
    b0 = {"node": "b", "device_uuid": "GPU-b0"}
    assert value(found, "hami_gpu_memory_allocated_bytes", **b0) == 0
    assert value(found, "hami_gpu_shared_count", **b0) == 0

    pod_labels = {"namespace": "team", "pod": "p", "node": "a"}
    first = {**pod_labels, "container_index": "0", "device_uuid": "GPU-a0"}
    third = {**pod_labels, "container_index": "2", "device_uuid": "GPU-a1"}
    assert value(found, "hami_vgpu_memory_allocated_bytes", **first) == 3000 * MIB
    assert value(found, "hami_vgpu_core_allocated_ratio", **first) == 30
    assert value(found, "hami_vgpu_memory_allocated_bytes", **third) == 2000 * MIB
    assert len(found["hami_vgpu_memory_allocated_bytes"]) == 2

    # This project's own names stay as they were.
    own = {"node": "a", "type": "nvidia", "uuid": "GPU-a0", "model": MODEL}
    assert value(found, "hami_device_memory_allocated_mib", **own) == 3000
    assert value(found, "hami_device_memory_total_mib", **own) == 10000
    assert value(found, "hami_device_slots_total", **own) == 10
    assert value(found, "hami_node_available", node="a", type="nvidia") == 1
    assert value(found, "hami_pods_holding_devices") == 1


def test_a_reservation_shows_per_container_before_any_annotation() -> None:
    c = cluster()
    two_nodes(c)
    request = pod(gpu("c0", mem=4000), name="r", namespace="team")
    parsed = parse_pod(request, [NVIDIA])
    assert parsed is not None
    decision = c.decide(parsed, ["b"])
    assert decision.node == "b" and decision.fit is not None
    c.reserve("team/r", "uid-r", "b", decision.fit)
    found = samples(SchedulerMetrics(c).render())
    labels = {"namespace": "team", "pod": "r", "node": "b", "container_index": "0"}
    assert value(found, "hami_vgpu_memory_allocated_bytes", **labels) == 4000 * MIB


def test_only_what_changed_is_rendered_again() -> None:
    c = cluster()
    two_nodes(c)
    m = SchedulerMetrics(c)
    m.render()
    kept_a, kept_b = m.cluster_text.nodes["a"], m.cluster_text.nodes["b"]
    assert c.changed_nodes == set()  # installed by the first render, then taken

    c.upsert_pod(running("p", "a", [[ContainerDevice("GPU-a1", "NVIDIA", 5000, 0)]]), NOW)
    assert c.changed_nodes == {"a"} and c.changed_pods == {"team/p"}
    found = samples(m.render())
    assert m.cluster_text.nodes["b"] is kept_b  # untouched node: the very same bytes
    assert m.cluster_text.nodes["a"] != kept_a
    a1 = {"node": "a", "device_uuid": "GPU-a1"}
    assert value(found, "hami_gpu_memory_allocated_bytes", **a1) == 5000 * MIB
    assert "hami_vgpu_memory_allocated_bytes" in found

    c.delete_pod("team/p")
    found = samples(m.render())
    assert value(found, "hami_gpu_memory_allocated_bytes", **a1) == 0
    assert "hami_vgpu_memory_allocated_bytes" not in found  # the pod's lines are gone

    c.delete_node("b")
    found = samples(m.render())
    assert all(labels["node"] != "b" for labels, _ in found["hami_gpu_memory_limit_bytes"])
    assert all(labels["node"] != "b" for labels, _ in found["hami_node_available"])


def test_untrusted_label_values_are_escaped() -> None:
    c = cluster()
    odd = 'A100 "40GB" \\ x'
    c.upsert_node(node("a", register(["GPU-a0"], model=odd)), NOW)
    found = samples(SchedulerMetrics(c).render())
    assert value(found, "hami_gpu_memory_limit_bytes", device_type=odd) == 32768 * MIB
    assert value(found, "hami_device_healthy", model=odd) == 1


def many_nodes(count: int) -> Cluster:
    c = cluster()
    for n in range(count):
        uuids = [f"GPU-{n}-{d}" for d in range(8)]
        c.upsert_node(node(f"node-{n:04d}", register(uuids, model=MODEL)), NOW)
    return c


async def scrape(m: SchedulerMetrics, *, gzipped: bool = False) -> tuple[bytes, int, int]:
    """(body, pieces written, loop turns other tasks got while it was written)."""
    pieces: list[bytes] = []
    turns = 0
    done = False

    async def other_task() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    async def write(data: bytes) -> None:
        pieces.append(data)

    ticker = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    turns = 0
    await m.write_to(write, gzip=gzipped)
    done = True
    await ticker
    body = b"".join(pieces)
    return (gzip.decompress(body) if gzipped else body), len(pieces), turns


async def test_a_scrape_is_written_in_pieces_and_lets_the_loop_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = many_nodes(300)
    m = SchedulerMetrics(c)
    monkeypatch.setattr(metrics, "SLICE_SECONDS", 0.0)  # yield after every node rendered
    monkeypatch.setattr(metrics, "FLUSH_BYTES", 64 * 1024)
    body, pieces, turns = await scrape(m)
    assert turns >= 300  # the first scrape renders all 300 nodes, one loop turn each
    assert pieces > 10
    assert body == m.render()  # the same exposition as at once
    assert body.count(b"\nhami_gpu_memory_limit_bytes{") == 300 * 8

    c.upsert_node(node("node-0000", register(["GPU-0-0"], model=MODEL), rv="2"), NOW)
    body, pieces, turns = await scrape(m, gzipped=True)
    assert turns > 10 and pieces > 1
    assert body == m.render()
    assert body.count(b"\nhami_gpu_memory_limit_bytes{") == 299 * 8 + 1


def test_a_standby_leaves_the_cluster_gauges_out_and_keeps_nothing() -> None:
    c = cluster()
    two_nodes(c)
    m = SchedulerMetrics(c)
    m.render()
    m.cluster_gauges = False
    found = samples(m.render())
    assert "hami_gpu_memory_limit_bytes" not in found
    assert "hami_filter_total" in found
    # Nothing piles up while it does not lead: no change tracking, no kept text.
    assert c.changed_nodes is None and c.changed_pods is None
    assert not m.cluster_text.nodes
    c.upsert_pod(running("p", "a", [[ContainerDevice("GPU-a0", "NVIDIA", 1000, 0)]]), NOW)
    m.cluster_gauges = True  # it leads: everything is rendered afresh
    found = samples(m.render())
    assert value(found, "hami_gpu_memory_allocated_bytes", device_uuid="GPU-a0") == 1000 * MIB


def test_too_many_changes_between_scrapes_render_everything_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics, "MAX_CHANGED", 2)
    c = cluster()
    two_nodes(c)
    m = SchedulerMetrics(c)
    m.render()
    kept_b = m.cluster_text.nodes["b"]
    for n in range(3):  # three pod keys: past the cap, the set stops growing
        c.upsert_pod(running(f"p{n}", "a", [[ContainerDevice("GPU-a0", "NVIDIA", 100, 0)]]), NOW)
    assert c.changed_pods is not None and len(c.changed_pods) == 2
    found = samples(m.render())
    assert m.cluster_text.nodes["b"] is not kept_b  # rendered again: a full pass
    assert len(found["hami_vgpu_memory_allocated_bytes"]) == 3
    assert value(found, "hami_gpu_memory_allocated_bytes", device_uuid="GPU-a0") == 300 * MIB


def _pod_on_a(c: Cluster) -> None:
    c.upsert_pod(running("p", "a", [[ContainerDevice("GPU-a0", "NVIDIA", 3000, 30)]]), NOW)


@pytest.mark.parametrize(
    ("groups", "present", "absent"),
    [
        (
            {"go"},
            {"hami_gpu_memory_allocated_bytes", "hami_node_gpu_overview"},
            {
                "hami_device_memory_allocated_mib",
                "hami_node_available",
                "hami_vgpu_memory_allocated_bytes",
            },
        ),
        (
            {"hami", "pods"},
            {
                "hami_device_memory_allocated_mib",
                "hami_node_available",
                "hami_vgpu_core_allocated_ratio",
            },
            {"hami_gpu_shared_count", "hami_node_gpu_overview"},
        ),
        (
            set(),
            {"hami_pods_holding_devices"},
            {
                "hami_device_memory_allocated_mib",
                "hami_gpu_shared_count",
                "hami_vgpu_memory_allocated_bytes",
            },
        ),
    ],
)
def test_scheduler_cluster_metrics_chooses_the_gauge_families(
    groups: set[str], present: set[str], absent: set[str]
) -> None:
    """scheduler.cluster_metrics: a family left out has no lines and no HELP/TYPE, and
    what is kept reads the same as with every family."""
    clusters = []
    for _ in range(2):  # one each: a cluster reports its changes to one reader
        c = cluster()
        two_nodes(c)
        _pod_on_a(c)
        clusters.append(c)
    every = samples(SchedulerMetrics(clusters[0]).render())
    text = SchedulerMetrics(clusters[1], groups).render()
    found = samples(text)
    for name in present:
        assert found.get(name) == every[name], name
    for name in absent:
        assert name not in found, name
        assert f"# HELP {name} ".encode() not in text, name


async def test_a_gzip_scrape_with_only_go_families_parses() -> None:
    c = cluster()
    two_nodes(c)
    _pod_on_a(c)
    body, _pieces, _turns = await scrape(SchedulerMetrics(c, {"go"}), gzipped=True)
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert "hami_gpu_memory_limit_bytes" in names
    assert not names & {"hami_device_memory_total_mib", "hami_vgpu_memory_allocated_bytes"}
