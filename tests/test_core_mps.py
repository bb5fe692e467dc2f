"""MPS GPUs in the scheduler core (issue 23 item 4, scheduler side): a GPU registered with
``mode: mps`` (Go HAMi's plugin writes its operating mode there) is matched against the
pod's ``nvidia.com/vgpu-mode`` as Go's ``checkType`` matches it (the value must contain the
device's mode; no value allows every mode), and is otherwise shared by memory and cores as
a hami-core GPU is. Pure: hami.core.cluster and hami.core.requests."""

from __future__ import annotations

import json
from datetime import timedelta

from _core_helpers import NOW, NVIDIA, gpu, node, pod

from hami.core.cluster import Cluster, Decision
from hami.core.requests import parse_pod
from hami.protocol.register import NodeDevice, encode_node_devices_json

MPS = {"nvidia.com/vgpu-mode": "mps"}
CORE = {"nvidia.com/vgpu-mode": "hami-core"}


def device(uuid: str, mode: str, index: int, memory: int = 15360) -> NodeDevice:
    return NodeDevice(uuid, 4, memory, 100, "NVIDIA-Tesla T4", 0, True, index, mode)


def cluster(*nodes: tuple[str, list[NodeDevice]]) -> Cluster:
    c = Cluster([NVIDIA], handshake_timeout=timedelta(seconds=60))
    for name, devices in nodes:
        errors, _ = c.upsert_node(node(name, encode_node_devices_json(devices)), NOW)
        assert errors == []
    c.refresh(NOW)
    return c


def place(
    c: Cluster,
    name: str,
    memory: int,
    annotations: dict[str, str] | None = None,
    cores: int | None = None,
) -> Decision:
    request = parse_pod(
        pod(gpu(mem=memory, cores=cores), name=name, uid=f"uid-{name}", annotations=annotations),
        [NVIDIA],
    )
    assert request is not None
    decision = c.decide(request)
    if decision.fit is not None and decision.node is not None:
        c.reserve(f"default/{name}", f"uid-{name}", decision.node, decision.fit)
    return decision


def uuid_of(decision: Decision) -> str:
    assert decision.fit is not None, decision.failed
    return decision.fit.assignment["nvidia"][0][0].uuid


def test_the_register_mode_is_read_as_go_writes_it() -> None:
    value = encode_node_devices_json([device("GPU-s", "mps", 0)])
    assert json.loads(value)[0]["mode"] == "mps"
    c = cluster(("n", [device("GPU-s", "mps", 0)]))
    assert [d.mode for d in c.nodes["n"].devices.values()] == ["mps"]


def test_an_mps_pod_goes_only_to_mps_gpus_and_a_hami_core_pod_never_to_them() -> None:
    c = cluster(("n", [device("GPU-h", "hami-core", 0), device("GPU-s", "mps", 1)]))
    for i in range(4):  # the MPS GPU takes four (its split count), never the other
        assert uuid_of(place(c, f"mps{i}", 1000, MPS, cores=20)) == "GPU-s"
    full = place(c, "mps4", 1000, MPS)
    assert full.fit is None
    assert full.failed["n"] == "1/2 CardTimeSlicingExhausted, 1/2 CardTypeMismatch"
    for i in range(4):
        assert uuid_of(place(c, f"core{i}", 1000, CORE)) == "GPU-h"
    assert place(c, "core4", 1000, CORE).fit is None


def test_without_vgpu_mode_a_pod_may_land_on_either_as_in_go() -> None:
    only_mps = cluster(("n", [device("GPU-s", "mps", 0)]))
    assert uuid_of(place(only_mps, "plain", 1000)) == "GPU-s"
    # a value naming both modes allows both, as Go's strings.Contains does
    assert uuid_of(place(only_mps, "both", 1000, {"nvidia.com/vgpu-mode": "mps,hami-core"})) == (
        "GPU-s"
    )


def test_an_mps_pod_on_nodes_without_mps_is_a_type_mismatch_per_node() -> None:
    c = cluster(
        ("core", [device("GPU-h0", "hami-core", 0), device("GPU-h1", "hami-core", 1)]),
        ("mig", [NodeDevice("GPU-m", 7, 40960, 100, "NVIDIA-A100", 0, True, 0, "mig")]),
        ("mps", [device("GPU-s", "mps", 0, memory=2000)]),
    )
    decision = place(c, "big", 4000, MPS)
    assert decision.fit is None
    assert decision.failed["core"] == "2/2 CardTypeMismatch"
    assert decision.failed["mig"] == "1/1 CardTypeMismatch"
    assert decision.failed["mps"] == "1/1 CardInsufficientMemory"
    assert decision.node is None


def test_mps_gpus_are_shared_by_memory_and_cores_as_hami_core_ones() -> None:
    c = cluster(("n", [device("GPU-s", "mps", 0, memory=10000)]))
    assert uuid_of(place(c, "a", 6000, MPS, cores=60)) == "GPU-s"
    assert place(c, "b", 6000, MPS, cores=10).failed["n"] == "1/1 CardInsufficientMemory"
    assert place(c, "c", 3000, MPS, cores=50).failed["n"] == "1/1 CardInsufficientCore"
    assert uuid_of(place(c, "d", 3000, MPS, cores=40)) == "GPU-s"
