"""MIG reservation in the scheduler core (issue 23 item 2): hami.core.migfit through
hami.core.cluster and hami.core.fit. Go HAMi 2.10's placement choices from
tests/data/hami-go-v2.10-mig.json, replayed as pods; fail-closed occupancy; vgpu-mode;
a fuzz of every way usage changes, checked for legal, non-overlapping layouts."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from _core_helpers import NOW, NVIDIA, gpu, node, pod, register
from _data import data_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core import migfit
from hami.core.cluster import Cluster, Decision
from hami.core.requests import parse_pod
from hami.protocol import ContainerDevice, encode_pod_devices, keys
from hami.protocol.mig import (
    MigAllocation,
    MigPlacement,
    MigProfile,
    encode_mig_allocations,
    placements_overlap,
)
from hami.protocol.register import NodeDevice, encode_node_devices_json

GO: dict[str, Any] = data_json("hami-go-v2.10-mig.json")
MIG_ON = {"nvidia.com/vgpu-mode": "mig"}
BIG = 1 << 20  # MiB: the HAMi-core memory check never decides in the replays

# Go cases this scheduler does not replay, and why (docs/scheduler.md "MIG").
NOT_REPLAYED = {
    "zero-size-placements": "a size-0 placement is never chosen (Go writes no reservation)",
    "uint32-wrap": "a placement past 2^32 slices is never chosen",
}


def _profiles(raw: list[dict[str, Any]]) -> tuple[MigProfile, ...]:
    return tuple(
        MigProfile(
            p["name"],
            p["memoryMB"],
            p["core"],
            p["sliceCount"],
            tuple(MigPlacement(x["start"], x["size"]) for x in p["placements"] or ()),
        )
        for p in raw
    )


def mig_register(
    profiles: tuple[MigProfile, ...], *, gpus: int = 1, memory: int = BIG, count: int = 64
) -> str:
    return encode_node_devices_json(
        NodeDevice(
            f"GPU-m{i}", count, memory, 100, "NVIDIA-A100-SXM4-40GB", 0, True, i, "mig", profiles
        )
        for i in range(gpus)
    )


def cluster_with(value: str) -> Cluster:
    c = Cluster([NVIDIA], handshake_timeout=timedelta(seconds=60))
    errors, _ = c.upsert_node(node("n", value), NOW)
    assert errors == []
    c.refresh(NOW)
    return c


def place(
    c: Cluster, name: str, memory: int, annotations: dict[str, str] | None = None, count: int = 1
) -> Decision:
    request = parse_pod(
        pod(gpu(count=count, mem=memory), name=name, annotations=annotations), [NVIDIA]
    )
    assert request is not None
    decision = c.decide(request)
    if decision.fit is not None and decision.node is not None:
        c.reserve(f"default/{name}", f"uid-{name}", decision.node, decision.fit)
    return decision


def bound_pod(name: str, devices: list[list[ContainerDevice]], mig: str | None) -> dict:
    annotations = {
        keys.VGPU_NODE: "n",
        "hami.io/vgpu-devices-allocated": encode_pod_devices(devices),
        keys.BIND_PHASE: "success",
    }
    if mig is not None:
        annotations[keys.MIG_ALLOCATIONS] = mig
    return pod(
        gpu(), name=name, uid=f"uid-{name}", node_name="n", phase="Running", annotations=annotations
    )


def holder(placements: list[MigPlacement], uuid: str = "GPU-m0") -> dict:
    """A running pod that holds ``placements`` on ``uuid`` (one device entry, readable)."""
    value = encode_mig_allocations(
        MigAllocation(0, i, uuid, "x", p) for i, p in enumerate(placements)
    )
    return bound_pod("holder", [[ContainerDevice(uuid, "NVIDIA", 0, 0)]], value)


# --------------------------------------------------------------------------- Go's choices


@pytest.mark.parametrize("case", GO["select"], ids=[c["name"] for c in GO["select"]])
def test_placements_follow_go_hami(case: dict[str, Any]) -> None:
    if case["name"] in NOT_REPLAYED:
        pytest.skip(NOT_REPLAYED[case["name"]])
    c = cluster_with(mig_register(_profiles(case["profiles"])))
    if case["occupied"]:
        occupied = [MigPlacement(p["start"], p["size"]) for p in case["occupied"]]
        assert c.upsert_pod(holder(occupied)) == []
    for i, step in enumerate(case["requests"]):
        if step["memory"] <= 0:  # a pod asks for at least 1 MiB
            continue
        decision = place(c, f"p{i}", step["memory"], MIG_ON)
        go = step["go"]
        if not go["ok"]:
            assert decision.fit is None, (case["name"], i)
            assert migfit.MIG_INFEASIBLE in decision.failed["n"]
            continue
        assert decision.fit is not None, (case["name"], i, decision.failed)
        (allocation,) = decision.fit.mig
        want = go["placement"]
        assert (allocation.profile, allocation.placement) == (
            go["profile"],
            MigPlacement(want["start"], want["size"]),
        ), (case["name"], i)
        (device,) = decision.fit.assignment["nvidia"][0]
        assert (device.memory, device.cores) == (go["usedmem"], go["usedcores"])


# --------------------------------------------------------------------------- behaviour

A100: tuple[MigProfile, ...] = _profiles(GO["select"][0]["profiles"])


def test_decision_writes_gos_reservation_and_reads_back_the_same_hold() -> None:
    c = cluster_with(mig_register(A100, memory=40960, count=7))
    decision = place(c, "a", 19000, MIG_ON)
    assert decision.fit is not None
    value = encode_mig_allocations(decision.fit.mig)
    assert value == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-m0","profile":"3g.20gb",'
        '"placement":{"start":4,"size":4}}]'
    )
    reserved = c.pods["default/a"]
    written = pod(
        gpu(mem=19000),
        name="a",
        uid="uid-a",
        annotations={
            keys.VGPU_NODE: "n",
            "hami.io/vgpu-devices-allocated": encode_pod_devices(decision.fit.assignment["nvidia"]),
            keys.MIG_ALLOCATIONS: value,
            keys.VGPU_TIME: str(int(NOW.timestamp())),
        },
    )
    record, errors = c.pod_record(written)
    assert errors == [] and record is not None
    assert record.mig == reserved.mig == {"GPU-m0": (MigPlacement(4, 4),)}
    # the next one sees the 3g instance, and deleting frees it
    assert place(c, "b", 19000, MIG_ON).fit.mig[0].placement == MigPlacement(0, 4)
    decision = place(c, "c", 1000, MIG_ON)
    assert decision.fit is None
    assert decision.failed["n"] == (
        "1/1 CardMigTopologyInfeasible (no 1g.5gb or larger placement free on GPU 0)"
    )
    c.delete_pod("default/a")
    assert place(c, "c", 1000, MIG_ON).fit.mig[0].placement == MigPlacement(6, 1)
    c.release("default/b")
    c.release("default/c")
    assert c.nodes["n"].mig == {}


def test_vgpu_mode_selects_device_modes_as_go_reads_it() -> None:
    value = json.loads(mig_register(A100, memory=40960, count=7))
    plain = json.loads(
        encode_node_devices_json([NodeDevice("GPU-h", 10, 40960, 100, "NVIDIA-A100", 0, True, 1)])
    )
    c = cluster_with(json.dumps(value + plain))
    first = place(c, "a", 1000, MIG_ON)
    assert first.fit.assignment["nvidia"][0][0].uuid == "GPU-m0"
    core = place(c, "b", 1000, {"nvidia.com/vgpu-mode": "hami-core"})
    assert core.fit.assignment["nvidia"][0][0].uuid == "GPU-h" and core.fit.mig == ()
    # a value naming both modes allows both
    both = parse_pod(
        pod(gpu(mem=1000), annotations={"nvidia.com/vgpu-mode": "mig,hami-core"}), [NVIDIA]
    )
    assert both is not None and both.selectors["nvidia"].vgpu_mode == "mig,hami-core"
    only_core = cluster_with(json.dumps(plain))
    missed = place(only_core, "c", 1000, MIG_ON)
    assert missed.failed["n"] == "1/1 CardTypeMismatch"


def test_a_pod_without_a_readable_reservation_fills_the_gpu() -> None:
    c = cluster_with(mig_register(A100, memory=40960, count=7))
    devices = [[ContainerDevice("GPU-m0", "NVIDIA", 4864, 15)]]
    # no annotation: a HAMi-core pod (or another scheduler's) on the MIG GPU
    assert c.upsert_pod(bound_pod("x", devices, None)) == []
    reason = place(c, "a", 1000, MIG_ON).failed["n"]
    assert "free slices are unknown" in reason
    # an unreadable value: fails closed, and says so
    c.delete_pod("default/x")
    errors = c.upsert_pod(bound_pod("x", devices, "[{"))
    assert len(errors) == 1 and keys.MIG_ALLOCATIONS in errors[0]
    assert "every MIG slice of GPU-m0" in errors[0]
    assert place(c, "a", 1000, MIG_ON).fit is None
    # a readable one frees what it does not hold
    good = encode_mig_allocations([MigAllocation(0, 0, "GPU-m0", "1g.5gb", MigPlacement(6, 1))])
    assert c.upsert_pod(bound_pod("x", devices, good)) == []
    assert place(c, "a", 1000, MIG_ON).fit.mig[0].placement == MigPlacement(5, 1)
    # it goes bad again: the last readable hold stands
    errors = c.upsert_pod(bound_pod("x", devices, "not json"))
    assert "last readable value" in errors[0]
    assert c.pods["default/x"].mig == {"GPU-m0": (MigPlacement(6, 1),)}
    # fewer reservations than devices on the GPU: unknown again
    two = [[ContainerDevice("GPU-m0", "NVIDIA", 4864, 15)] * 2]
    c.delete_pod("default/x")
    c.upsert_pod(bound_pod("x", two, good))
    assert migfit.WHOLE in c.pods["default/x"].mig["GPU-m0"]
    assert place(c, "b", 1000, MIG_ON).fit is None


def test_reservations_on_a_gpu_not_in_mig_mode_refuse_it() -> None:
    plain = encode_node_devices_json(
        [NodeDevice("GPU-h", 10, 40960, 100, "NVIDIA-A100", 0, True, 0)]
    )
    c = cluster_with(plain)
    mig = encode_mig_allocations([MigAllocation(0, 0, "GPU-h", "1g.5gb", MigPlacement(0, 1))])
    c.upsert_pod(bound_pod("x", [[ContainerDevice("GPU-h", "NVIDIA", 100, 0)]], mig))
    assert "not in MIG mode" in place(c, "a", 1000).failed["n"]


def test_reservations_outlive_the_node_and_come_back_with_it() -> None:
    c = cluster_with(mig_register(A100, memory=40960, count=7))
    c.upsert_pod(holder([MigPlacement(0, 8)]))
    c.delete_node("n")
    c.upsert_node(node("n", mig_register(A100, memory=40960, count=7)), NOW)
    c.refresh(NOW)
    assert place(c, "a", 1000, MIG_ON).fit is None
    c.delete_pod("default/holder")
    assert place(c, "a", 1000, MIG_ON).fit is not None


def test_containers_of_one_pod_take_disjoint_instances() -> None:
    c = cluster_with(mig_register(A100, memory=40960, count=7))
    request = parse_pod(
        pod(gpu("a", mem=19000), gpu("b", mem=19000), init=(gpu("i", mem=4000),)), [NVIDIA]
    )
    decision = c.decide(request)
    assert decision.fit is None  # 3g + 3g fill all slices; the init instance needs one more
    request = parse_pod(pod(gpu("a", mem=19000), init=(gpu("i", mem=4000),)), [NVIDIA])
    decision = c.decide(request)
    assert [(a.container_index, a.profile, a.placement) for a in decision.fit.mig] == [
        (0, "1g.5gb", MigPlacement(6, 1)),
        (1, "3g.20gb", MigPlacement(0, 4)),
    ]


def test_a_non_mig_node_is_unchanged() -> None:
    c = cluster_with(register(["GPU-0"], memory=10000))
    decision = place(c, "a", 1000)
    assert decision.fit.mig == () and c.pods["default/a"].mig == {}
    assert c.nodes["n"].mig == {}


# --------------------------------------------------------------------------- fuzz

TABLES = [
    _profiles(next(c for c in GO["select"] if c["name"] == name)["profiles"])
    for name in ("a100-40-mixed", "a100-80-fill-mixed", "h100-mixed", "h200-fill")
]

PLACE = st.tuples(
    st.just("place"), st.one_of(st.integers(1, 25_000), st.integers(1, 150_000)), st.booleans()
)
OPS = st.lists(
    st.one_of(
        PLACE,
        PLACE,
        PLACE,
        st.tuples(st.just("bind"), st.integers(0, 40), st.booleans()),
        st.tuples(st.just("drop"), st.integers(0, 40), st.booleans()),
        st.tuples(st.just("garbage"), st.text(max_size=40), st.booleans()),
    ),
    min_size=4,
    max_size=40,
)


def _legal_layout(c: Cluster, profiles: tuple[MigProfile, ...]) -> None:
    legal = {p for profile in profiles for p in profile.placements}
    slices = migfit.gpu_slices(profiles)
    for name, state in c.nodes.items():
        for uuid in state.devices:
            held = [
                p
                for record in c.pods.values()
                if record.node == name
                for p in record.mig.get(uuid, ())
                if p != migfit.WHOLE
            ]
            assert all(p in legal for p in held), held
            assert sum(p.size for p in held) <= slices
            for i, a in enumerate(held):
                for b in held[i + 1 :]:
                    assert not placements_overlap(a, b), held


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=st.sampled_from(TABLES), gpus=st.integers(1, 2), ops=OPS)
def test_fuzz_never_an_illegal_or_overlapping_layout(
    table: tuple[MigProfile, ...], gpus: int, ops: list[tuple[str, Any, bool]]
) -> None:
    c = cluster_with(mig_register(table, gpus=gpus, memory=150_000, count=7))
    placed: list[str] = []
    for step, (op, arg, flag) in enumerate(ops):
        if op == "place":
            name = f"p{step}"
            decision = place(c, name, arg, MIG_ON if flag else None)
            if decision.fit is not None:
                for allocation in decision.fit.mig:
                    profile = next(p for p in table if p.name == allocation.profile)
                    assert profile.memory_mb >= arg
                    assert allocation.placement in profile.placements
                placed.append(name)
        elif op in ("bind", "drop") and placed:
            name = placed[arg % len(placed)]
            key = f"default/{name}"
            record = c.pods.get(key)
            if op == "drop" or record is None:
                c.delete_pod(key)
                continue
            decision_mig = [
                MigAllocation(0, i, uuid, "p", p)
                for uuid, held in record.mig.items()
                for i, p in enumerate(held)
            ]
            devices = [[ContainerDevice(u, "NVIDIA", 1, 0) for u in record.usage]]
            value = encode_mig_allocations(decision_mig) if flag else "[]"
            c.upsert_pod(bound_pod(name, devices, value))
        elif op == "garbage":
            devices = [[ContainerDevice("GPU-m0", "NVIDIA", 1, 0)]]
            c.upsert_pod(bound_pod(f"g{step}", devices, arg if flag else None))
        _legal_layout(c, table)
    for key in list(c.pods):
        c.delete_pod(key)
    assert c.nodes["n"].mig == {}
    assert all(d.mig_hold is None and d.used == 0 for d in c.nodes["n"].devices.values())


def test_bind_fence_judges_slices_not_cores() -> None:
    from hami.core.fence import bind_refusal

    c = cluster_with(mig_register(A100, memory=40960, count=7))
    for i in range(7):  # seven 1g instances: 105 % cores as Go counts them, all legal
        decision = place(c, f"p{i}", 4000, MIG_ON)
        assert decision.fit is not None
        key = f"default/p{i}"
        assert bind_refusal(c, key, c.pods[key]) is None
    c = cluster_with(mig_register(A100, memory=40960, count=7))
    assert place(c, "a", 19000, MIG_ON).fit.mig[0].placement == MigPlacement(4, 4)
    # another replica wrote an overlapping decision on pod b (seen by our watch)
    value = encode_mig_allocations([MigAllocation(0, 0, "GPU-m0", "1g.5gb", MigPlacement(6, 1))])
    other = bound_pod("b", [[ContainerDevice("GPU-m0", "NVIDIA", 4864, 15)]], value)
    del other["spec"]["nodeName"]
    other["metadata"]["annotations"][keys.VGPU_TIME] = str(int(NOW.timestamp()))
    assert c.upsert_pod(other, NOW) == []
    why = bind_refusal(c, "default/a", c.pods["default/a"])
    assert why == "MIG GPU GPU-m0: slices 4-7 are no longer free"
    # a shadow (a decision written on a pod this replica reserved elsewhere) counts too
    c.delete_pod("default/b")
    assert bind_refusal(c, "default/a", c.pods["default/a"]) is None
    shadow = c.pod_record(other)[0]
    assert shadow is not None
    why = bind_refusal(c, "default/a", c.pods["default/a"], shadows=[shadow])
    assert why is not None and "no longer free" in why
