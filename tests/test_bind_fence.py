"""The bind fence's judgement (hami.core.fence.bind_refusal) and the lock rule that lets a
new leader take over a lock whose bind can no longer be in flight (LockRules.bind_window).

The fence itself (write, watch, check, conditional Binding) runs against the real API
server in test_bind_fence_controlplane.py; here each rule alone, on the pure cluster."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from _core_helpers import NOW, NVIDIA, gpu, node, pod, register

from hami.core.cluster import Cluster
from hami.core.fence import bind_refusal
from hami.core.podrecord import PodRecord
from hami.core.requests import parse_pod
from hami.kube.nodelock import LockRules, judge_holder
from hami.protocol import ContainerDevice, NodeLock, encode_pod_devices

UUID = "GPU-a0"


def _cluster() -> Cluster:
    c = Cluster([NVIDIA], handshake_timeout=timedelta(seconds=60))
    c.upsert_node(node("a", register([UUID], memory=10000, count=4)), NOW)
    return c


def _reserve(c: Cluster, name: str, memory: int, cores: int = 0) -> PodRecord:
    request = parse_pod(pod(gpu(mem=memory, cores=cores or None), name=name), [NVIDIA])
    assert request is not None
    decision = c.decide(request)
    assert decision.node == "a" and decision.fit is not None, decision.failed
    c.reserve(f"default/{name}", f"uid-{name}", "a", decision.fit)
    return c.pods[f"default/{name}"]


def _written(name: str, memory: int, *, bound: bool = False, cores: int = 0) -> dict:
    """A pod carrying a decision on GPU-a0 (written by some scheduler)."""
    value = encode_pod_devices([[ContainerDevice(UUID, "NVIDIA", memory, cores)]])
    return pod(
        gpu(mem=memory),
        name=name,
        uid=f"uid-{name}",
        node_name="a" if bound else None,
        annotations={
            "hami.io/vgpu-node": "a",
            "hami.io/vgpu-devices-allocated": value,
            "hami.io/vgpu-time": str(int(NOW.timestamp())),
        },
    )


def test_a_decision_that_fits_passes_and_is_not_counted_twice() -> None:
    c = _cluster()
    mine = _reserve(c, "p", 6000)
    assert bind_refusal(c, "default/p", mine) is None
    # our own write, as the watch shows it, replaces the reservation: still one hold
    c.upsert_pod(_written("p", 6000), NOW)
    assert not c.pods["default/p"].reserved
    assert bind_refusal(c, "default/p", mine) is None


def test_another_replicas_written_decision_refuses_what_no_longer_fits() -> None:
    c = _cluster()
    mine = _reserve(c, "p", 6000)
    c.upsert_pod(_written("other", 5000), NOW)  # written elsewhere, not bound yet
    reason = bind_refusal(c, "default/p", mine)
    assert reason is not None and "11000 MiB of 10000 MiB" in reason
    # the node and type checks alone (before the lock) still pass
    assert bind_refusal(c, "default/p", mine, fit=False) is None


def test_shadowed_decisions_count() -> None:
    """A decision written on a pod that this replica has since reserved elsewhere may still
    be bound by the replica that wrote it: the fence counts it."""
    c = _cluster()
    mine = _reserve(c, "p", 6000)
    shadow, _ = c.pod_record(_written("q", 5000))
    assert shadow is not None
    assert bind_refusal(c, "default/p", mine) is None
    reason = bind_refusal(c, "default/p", mine, shadows=[shadow])
    assert reason is not None and "MiB" in reason


def test_split_count_cores_and_exclusive_use() -> None:
    c = _cluster()
    for i in range(3):
        c.upsert_pod(_written(f"w{i}", 100, bound=True), NOW)
    mine = _reserve(c, "p", 100)
    assert bind_refusal(c, "default/p", mine) is None
    c.upsert_pod(_written("w3", 100, bound=True), NOW)
    assert "5 slices" in (bind_refusal(c, "default/p", mine) or "")

    c = _cluster()
    mine = _reserve(c, "p", 1000, cores=60)
    c.upsert_pod(_written("other", 1000, cores=50), NOW)
    assert "110% cores" in (bind_refusal(c, "default/p", mine) or "")

    c = _cluster()
    mine = _reserve(c, "p", 1000, cores=100)
    assert bind_refusal(c, "default/p", mine) is None
    c.upsert_pod(_written("other", 1000), NOW)
    reason = bind_refusal(c, "default/p", mine)
    assert reason is not None and "exclusive" in reason


def test_a_node_or_type_that_went_away_refuses() -> None:
    c = _cluster()
    mine = _reserve(c, "p", 1000)
    # the scheduler asks, the node's agent never answers: the handshake times out
    c.refresh(NOW)
    stamp = "Requesting_2024-05-20 10:00:00"
    c.upsert_node(node("a", register([UUID], memory=10000, count=4), shake=stamp, rv="2"), NOW)
    _, changes = c.refresh(NOW + timedelta(seconds=61))
    assert [(ch.node, ch.available) for ch in changes] == [("a", False)]
    reason = bind_refusal(c, "default/p", mine, fit=False)
    assert reason is not None and "unavailable" in reason

    c = _cluster()
    mine = _reserve(c, "p", 1000)
    c.delete_node("a")
    assert "no longer exists" in (bind_refusal(c, "default/p", mine, fit=False) or "")


def test_a_device_that_left_or_turned_unhealthy_refuses() -> None:
    c = _cluster()
    mine = _reserve(c, "p", 1000)
    c.upsert_node(node("a", register([UUID], memory=10000, healthy=[False]), rv="2"), NOW)
    assert "unhealthy" in (bind_refusal(c, "default/p", mine) or "")
    c.upsert_node(node("a", register(["GPU-other"], memory=10000), rv="3"), NOW)
    assert "no longer registered" in (bind_refusal(c, "default/p", mine) or "")


@pytest.mark.parametrize("seed", range(20))
def test_decisions_written_in_any_order_never_pass_over_capacity(seed: int) -> None:
    """Two replicas with pictures of their own reserve and bind in random order. A bind
    passes when the fence, asked after all earlier writes are seen (the watch's order),
    says so; whatever passes fits the device."""
    rng = random.Random(seed)
    replicas = [_cluster(), _cluster()]
    pending: list[tuple[int, str, PodRecord]] = []
    for i in range(12):
        replica = rng.randrange(2)
        request = parse_pod(pod(gpu(mem=rng.choice((1000, 2500, 4000))), name=f"p{i}"), [NVIDIA])
        assert request is not None
        decision = replicas[replica].decide(request)
        if decision.node is None or decision.fit is None:
            continue
        replicas[replica].reserve(f"default/p{i}", f"uid-p{i}", "a", decision.fit)
        pending.append((replica, f"p{i}", replicas[replica].pods[f"default/p{i}"]))
    rng.shuffle(pending)
    written: list[dict] = []
    bound_memory = 0
    for replica, name, record in pending:
        memory = record.usage[UUID].memory
        obj = _written(name, memory)
        written.append(obj)
        for c in replicas:  # the watch shows the write to both
            c.upsert_pod(obj, NOW)
        if bind_refusal(replicas[replica], f"default/{name}", record) is None:
            bound_memory += memory
        else:
            for c in replicas:  # undo: marked failed, it holds nothing
                c.delete_pod(f"default/{name}")
    assert bound_memory <= 10000


def test_an_unbound_lock_holder_past_the_bind_window_is_stale() -> None:
    rules = LockRules(
        timeout=timedelta(minutes=5),
        allocation_timeout=timedelta(seconds=60),
        bind_window=timedelta(seconds=25),
    )
    lock = NodeLock(NOW - timedelta(seconds=30), "default", "h")
    unbound = pod(gpu(), name="h")
    assert judge_holder(lock, unbound, "a", NOW, rules).stale
    # within the window, or without one (the node agent's rules), it is held
    assert not judge_holder(lock, unbound, "a", NOW - timedelta(seconds=10), rules).stale
    assert not judge_holder(lock, unbound, "a", NOW, LockRules()).stale
    # a bound holder is judged by its allocation progress, as before
    bound = pod(gpu(), name="h", node_name="a")
    assert not judge_holder(lock, bound, "a", NOW, rules).stale
