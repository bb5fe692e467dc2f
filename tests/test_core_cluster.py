"""Cluster state: registration, handshake availability, incremental usage, node policies."""

from __future__ import annotations

from datetime import timedelta

from _core_helpers import NOW, NVIDIA, gpu, node, pod, register

from hami.core.cluster import Cluster
from hami.core.requests import PodRequest, parse_pod
from hami.protocol import ContainerDevice, encode_pod_devices


def req(*containers: dict, annotations: dict | None = None) -> PodRequest:
    r = parse_pod(pod(*containers, annotations=annotations), [NVIDIA])
    assert r is not None
    return r


def cluster(**kwargs) -> Cluster:
    return Cluster([NVIDIA], handshake_timeout=timedelta(seconds=60), **kwargs)


def running(
    name: str,
    node_name: str,
    devices: list[list[ContainerDevice]],
    *,
    init: int = 0,
    phase: str = "Running",
    bind_phase: str = "success",
    bound: bool = True,
) -> dict:
    p = pod(
        *[gpu(f"c{i}") for i in range(len(devices) - init)],
        init=tuple(gpu(f"i{i}") for i in range(init)),
        name=name,
        uid=f"uid-{name}",
        node_name=node_name if bound else None,
        phase=phase,
        annotations={
            "hami.io/vgpu-node": node_name,
            "hami.io/vgpu-devices-allocated": encode_pod_devices(devices),
            "hami.io/bind-phase": bind_phase,
        },
    )
    return p


def two_nodes(c: Cluster) -> None:
    c.upsert_node(node("a", register(["GPU-a0", "GPU-a1"], memory=10000)), NOW)
    c.upsert_node(node("b", register(["GPU-b0", "GPU-b1"], memory=10000)), NOW)


def test_handshake_pass_writes_and_times_out() -> None:
    c = cluster()
    two_nodes(c)
    writes, changes = c.refresh(NOW)
    assert {(w.node, w.resource_version) for w in writes} == {("a", "1"), ("b", "1")}
    assert writes[0].annotations == {
        "hami.io/node-handshake-nvidia": "Requesting_2024-05-20 10:00:00"
    }
    assert changes == []
    # the scheduler's stamp comes back; node b answers, node a stays silent
    stamp = "Requesting_2024-05-20 10:00:00"
    c.upsert_node(node("a", register(["GPU-a0", "GPU-a1"], memory=10000), shake=stamp, rv="2"), NOW)
    c.upsert_node(node("b", register(["GPU-b0", "GPU-b1"], memory=10000), shake=stamp, rv="2"), NOW)
    writes, changes = c.refresh(NOW + timedelta(seconds=60))
    assert writes == [] and changes == []
    c.upsert_node(
        node(
            "b",
            register(["GPU-b0", "GPU-b1"], memory=10000),
            shake="Reported_2024-05-20 10:00:30",
            rv="3",
        ),
        NOW + timedelta(seconds=30),
    )
    writes, changes = c.refresh(NOW + timedelta(seconds=61))
    assert [(w.node, w.resource_version) for w in writes] == [("b", "3")]
    assert [(ch.node, ch.available, ch.reason) for ch in changes] == [
        ("a", False, "handshake timed out")
    ]
    decision = c.decide(req(gpu(mem=10)), ["a", "b"])
    assert decision.node == "b"
    d = c.decide(req(gpu(mem=20000)), ["a", "b"])
    assert d.node is None
    assert d.failed == {"a": "handshake timed out", "b": "2/2 CardInsufficientMemory"}
    # node a answers again: available at the next pass (and on the event itself)
    _, changes = c.upsert_node(
        node(
            "a",
            register(["GPU-a0", "GPU-a1"], memory=10000),
            shake="Reported_2024-05-20 10:01:05",
            rv="4",
        ),
        NOW + timedelta(seconds=65),
    )
    assert [(ch.node, ch.available) for ch in changes] == [("a", True)]


def test_unregistered_and_malformed_register() -> None:
    c = cluster()
    errors, _ = c.upsert_node(node("bad", "GPU-x,10,notanumber,100,M,0,true:"), NOW)
    assert errors and "memory" in errors[0]
    c.upsert_node(node("plain", None, shake=None), NOW)
    c.upsert_node(node("shaken", None), NOW)
    d = c.decide(req(gpu()), ["bad", "plain", "shaken", "ghost"])
    assert d.node is None
    assert d.failed["bad"].startswith("invalid node register value")
    assert d.failed["plain"] == "node unregistered"
    assert d.failed["shaken"] == "node unregistered"
    assert d.failed["ghost"] == "node unregistered"
    # fixed value: usable
    c.upsert_node(node("bad", register(["GPU-x"]), rv="2"), NOW)
    assert c.decide(req(gpu()), ["bad"]).node == "bad"


def test_usage_from_pods_incremental_and_finished() -> None:
    c = cluster()
    two_nodes(c)
    p1 = running("p1", "a", [[ContainerDevice("GPU-a0", "NVIDIA", 3000, 20)]])
    p2 = running(
        "p2",
        "a",
        [
            [ContainerDevice("GPU-a0", "NVIDIA", 1000, 0)],
            [ContainerDevice("GPU-a1", "NVIDIA", 500, 0)],
        ],
    )
    c.upsert_pod(p1)
    c.upsert_pod(p2)
    assert c.usage_snapshot() == {"a": {"GPU-a0": (2, 4000, 20), "GPU-a1": (1, 500, 0)}}
    c.upsert_pod(p1)  # same again: no double count
    assert c.usage_snapshot()["a"]["GPU-a0"] == (2, 4000, 20)
    p1["status"]["phase"] = "Succeeded"
    c.upsert_pod(p1)
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 1000, 0), "GPU-a1": (1, 500, 0)}}
    c.delete_pod("default/p2")
    assert c.usage_snapshot() == {}


def test_bind_failed_counts_only_when_the_pod_runs_all_the_same() -> None:
    c = cluster()
    two_nodes(c)
    devices = [[ContainerDevice("GPU-a0", "NVIDIA", 3000, 0)]]
    unbound = running("p", "a", devices, bind_phase="failed", bound=False)
    unbound["status"]["phase"] = "Pending"
    c.upsert_pod(unbound)
    assert c.usage_snapshot() == {}
    # Bound, but its Allocate failed or was lost (the lock sweep failed it): kubelet will
    # not start it with these devices, so they are free for the next pod.
    lost = running("q", "a", devices, bind_phase="failed", bound=True)
    lost["status"]["phase"] = "Pending"
    c.upsert_pod(lost)
    assert c.usage_snapshot() == {}
    lost["status"]["phase"] = "Running"
    c.upsert_pod(lost)
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 3000, 0)}}


def test_pods_before_nodes_and_malformed_allocations() -> None:
    c = cluster()
    c.upsert_pod(running("p", "a", [[ContainerDevice("GPU-a0", "NVIDIA", 9000, 0)]]))
    bad = running("bad", "a", [])
    bad["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = "GPU-a0,NVIDIA,x,0:;"
    assert c.upsert_pod(bad)
    two_nodes(c)
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 9000, 0)}}
    d = c.decide(req(gpu(mem=2000), annotations={"nvidia.com/use-gpuuuid": "GPU-a0"}), ["a"])
    # the unreadable value names GPU-a0: held whole (fails closed), not "costs nothing"
    assert d.failed == {"a": "1/2 CardTimeSlicingExhausted, 1/2 CardUuidMismatch"}


def test_restart_rebuilds_same_usage() -> None:
    c = cluster()
    two_nodes(c)
    pods = [
        running("p1", "a", [[ContainerDevice("GPU-a0", "NVIDIA", 3000, 20)]]),
        running(
            "p2",
            "b",
            [
                [ContainerDevice("GPU-b0", "NVIDIA", 9000, 100)],
                [ContainerDevice("GPU-b0", "NVIDIA", 1000, 10)],
            ],
            init=1,
        ),
    ]
    for p in pods:
        c.upsert_pod(p)
    fresh = cluster()
    for p in reversed(pods):
        fresh.upsert_pod(p)
    two_nodes(fresh)
    assert fresh.usage_snapshot() == c.usage_snapshot()
    assert c.usage_snapshot()["b"] == {"GPU-b0": (1, 9000, 100)}


def test_node_policies_and_overrides() -> None:
    c = cluster()
    two_nodes(c)
    c.upsert_pod(running("p", "b", [[ContainerDevice("GPU-b0", "NVIDIA", 3000, 0)]]))
    r = req(gpu(mem=1000))
    assert c.decide(r).node == "b"  # binpack: the used node
    assert cluster(node_policy="spread").node_policy == "spread"
    spread = req(gpu(mem=1000), annotations={"hami.io/node-scheduler-policy": "spread"})
    assert c.decide(spread).node == "a"
    # device spread on b picks the idle device, binpack the used one
    d = c.decide(r)
    assert d.fit is not None and d.fit.assignment["nvidia"][0][0].uuid == "GPU-b1"
    packed = req(gpu(mem=1000), annotations={"hami.io/gpu-scheduler-policy": "binpack"})
    d = c.decide(packed)
    assert d.fit is not None and d.fit.assignment["nvidia"][0][0].uuid == "GPU-b0"
    # ties by name
    assert cluster_tie().decide(req(gpu())).node == "a"


def cluster_tie() -> Cluster:
    c = cluster()
    two_nodes(c)
    return c


def test_scores_include_the_request() -> None:
    # b has bigger devices: the same request raises its utilisation less
    c = cluster(node_policy="spread")
    c.upsert_node(node("a", register(["GPU-a0"], memory=10000)), NOW)
    c.upsert_node(node("b", register(["GPU-b0"], memory=80000)), NOW)
    d = c.decide(req(gpu(mem=5000)))
    assert d.node == "b"
    c2 = cluster(node_policy="binpack")
    c2.upsert_node(node("a", register(["GPU-a0"], memory=10000)), NOW)
    c2.upsert_node(node("b", register(["GPU-b0"], memory=80000)), NOW)
    assert c2.decide(req(gpu(mem=5000))).node == "a"


def test_reservation_is_seen_and_rolled_back() -> None:
    c = cluster()
    c.upsert_node(node("a", register(["GPU-a0"], memory=10000, count=2)), NOW)
    r = req(gpu(mem=6000))
    d = c.decide(r)
    assert d.node == "a" and d.fit is not None
    previous = c.reserve("default/p", "uid-p", "a", d.fit)
    assert previous is None
    assert c.decide(r).node is None  # the second pod sees the first one's reservation
    c.upsert_pod(pod(gpu(mem=6000)))  # the pod without its decision yet: the hold stays
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 6000, 0)}}
    c.rollback("default/p", previous)
    assert c.usage_snapshot() == {}
    assert c.decide(r).node == "a"


def test_candidates_subset_and_full_nodes_skipped() -> None:
    c = cluster()
    for i in range(40):
        c.upsert_node(node(f"n{i:02d}", register([f"GPU-{i}"], memory=10000, count=1)), NOW)
    for i in range(0, 40, 2):
        c.upsert_pod(running(f"p{i}", f"n{i:02d}", [[ContainerDevice(f"GPU-{i}", "NVIDIA", 1, 0)]]))
    r = req(gpu(mem=10))
    d = c.decide(r, ["n04", "n07", "n09"])
    assert d.node == "n07"
    assert d.evaluated == 2  # n04 is ruled out by its summary, n07 and n09 fit
    d = c.decide(r, [f"n{i:02d}" for i in range(0, 40, 2)])
    assert d.node is None
    assert set(d.failed.values()) == {"1/1 CardTimeSlicingExhausted"}
