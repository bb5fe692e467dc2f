"""Filter's reservations (issue 11 item 1): held in memory only, kept through the pod's
watch events until bind's write shows up, expired when no bind comes.

Pure logic (``hami.core.cluster``) and the scheduler's filter with an API client whose
every call fails: filter must answer without one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NoReturn, cast

from _core_helpers import NOW, NVIDIA, gpu, node, pod, register

from hami.config import Duration, SchedulerConfig
from hami.core.cluster import Cluster
from hami.core.requests import PodRequest, parse_pod
from hami.kube.client import Kube
from hami.protocol import ContainerDevice, encode_pod_devices, keys
from hami.scheduler.service import Clock, Scheduler

KEY = "default/p"


def one_gpu() -> Cluster:
    c = Cluster([NVIDIA], handshake_timeout=timedelta(seconds=60))
    c.upsert_node(node("a", register(["GPU-a0"], memory=10000, count=2)), NOW)
    return c


def request(mem: int) -> PodRequest:
    r = parse_pod(pod(gpu(mem=mem)), [NVIDIA])
    assert r is not None
    return r


def reserve(c: Cluster, mem: int = 6000, at: float = 0.0, key: str = KEY) -> None:
    decision = c.decide(request(mem))
    assert decision.node == "a" and decision.fit is not None
    c.reserve(key, "uid-p", "a", decision.fit, at=at)


def with_decision(
    mem: int = 6000,
    *,
    bound: bool = False,
    bind_phase: str | None = None,
    phase: str = "Pending",
    uuid: str = "GPU-a0",
) -> dict[str, Any]:
    annotations = {
        keys.VGPU_NODE: "a",
        keys.VGPU_TIME: str(int(NOW.timestamp())),
        NVIDIA.allocated_key: encode_pod_devices([[ContainerDevice(uuid, "NVIDIA", mem, 0)]]),
    }
    if bind_phase is not None:
        annotations[keys.BIND_PHASE] = bind_phase
    return pod(gpu(mem=mem), annotations=annotations, node_name="a" if bound else None, phase=phase)


HELD = {"a": {"GPU-a0": (1, 6000, 0)}}


# ------------------------------------------------------------------ the watch rule


def test_watch_events_before_binds_write_leave_the_reservation() -> None:
    c = one_gpu()
    reserve(c)
    # the pod as created (no decision), one with another (older) decision, and one whose
    # earlier bind failed: all from before bind's write, none undoes the hold
    for event in (
        pod(gpu(mem=6000)),
        with_decision(3000),
        with_decision(6000, uuid="GPU-other"),
        with_decision(6000, bind_phase="failed"),
    ):
        c.upsert_pod(event, NOW)
        assert c.usage_snapshot() == HELD, event
        assert c.pods[KEY].reserved
        assert KEY in c.reservations


def test_the_event_with_binds_write_turns_the_reservation_into_the_decision() -> None:
    c = one_gpu()
    reserve(c)
    c.upsert_pod(with_decision(6000), NOW)
    assert c.usage_snapshot() == HELD
    assert not c.pods[KEY].reserved
    assert KEY not in c.reservations  # no longer subject to the reservation timeout


def test_a_bound_pod_or_a_gone_one_ends_the_reservation() -> None:
    c = one_gpu()
    reserve(c)
    c.upsert_pod(with_decision(3000, bound=True, phase="Running"), NOW)  # bound: the truth
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 3000, 0)}}
    assert KEY not in c.reservations
    c2 = one_gpu()
    reserve(c2)
    c2.upsert_pod(pod(gpu(mem=6000), phase="Failed"), NOW)
    assert c2.usage_snapshot() == {} and not c2.reservations
    c3 = one_gpu()
    reserve(c3)
    c3.delete_pod(KEY)
    assert c3.usage_snapshot() == {} and not c3.reservations


# ------------------------------------------------------------------ expiry


def test_an_unbound_reservation_expires_and_frees_its_devices() -> None:
    c = one_gpu()
    reserve(c, at=100.0)
    assert c.expire_reservations(130.0, 30.0) == []  # at the timeout: still held
    assert c.usage_snapshot() == HELD
    assert c.expire_reservations(130.5, 30.0, keep={KEY}) == []  # its bind is running
    assert c.expire_reservations(130.5, 30.0) == [KEY]
    assert c.usage_snapshot() == {} and KEY not in c.pods and not c.reservations
    assert c.decide(request(10000)).node == "a"


def test_the_cheap_check_stops_at_the_first_reservation_in_time() -> None:
    c = one_gpu()
    reserve(c, mem=1000, at=0.0, key="default/old")
    reserve(c, mem=1000, at=50.0, key="default/new")
    assert c.expire_reservations(40.0, 30.0, full=False) == ["default/old"]
    assert list(c.reservations) == ["default/new"]


def test_decision_timeout_passes_do_not_touch_reservations() -> None:
    c = one_gpu()
    reserve(c)
    c.refresh(NOW + timedelta(hours=1))  # the decision deadline is for written decisions
    assert c.usage_snapshot() == HELD


def test_a_rolled_back_reservation_keeps_its_age() -> None:
    c = one_gpu()
    reserve(c, at=10.0)
    previous = c.pods[KEY]
    c.release(KEY)
    assert not c.reservations
    c.rollback(KEY, previous)
    assert c.reservations == {KEY: 10.0}


# ------------------------------------------------------------------ the scheduler


class NoApi:
    """An API client whose every request fails the test."""

    def with_retry(self, policy: Any) -> NoApi:  # a setting (the Event sender's), no request
        return self

    def __getattr__(self, name: str) -> NoReturn:
        raise AssertionError(f"the API was used: Kube.{name}")


class Ticks:
    def __init__(self) -> None:
        self.value = 1000.0

    def __call__(self) -> float:
        return self.value


def scheduler(ticks: Ticks) -> Scheduler:
    settings = SchedulerConfig(reservation_timeout=Duration(30))
    sched = Scheduler(
        settings,
        [NVIDIA],
        cast(Kube, NoApi()),
        clock=Clock(now=lambda: NOW, monotonic=ticks),
        emit_events=True,  # Events are queued for their sender's task: no I/O either
    )
    sched.on_node("ADDED", node("a", register(["GPU-a0"], memory=10000, count=2)))
    return sched


def gpu_pod(name: str, mem: int) -> dict[str, Any]:
    return pod(gpu(mem=mem), name=name, uid=f"uid-{name}")


async def test_filter_decides_and_reserves_without_any_api_call() -> None:
    ticks = Ticks()
    sched = scheduler(ticks)
    answer = await sched.filter({"Pod": gpu_pod("p", 6000), "NodeNames": ["a"]})
    assert answer == {"NodeNames": ["a"], "FailedNodes": {}, "Error": ""}
    record = sched.cluster.pods[KEY]
    assert record.reserved and record.decision is not None
    assert record.decision[keys.VGPU_NODE] == "a"
    assert record.decision[NVIDIA.allocated_key] == "GPU-a0,NVIDIA,6000,0:;"
    # the next pod sees the hold at once
    answer = await sched.filter({"Pod": gpu_pod("q", 6000), "NodeNames": ["a"]})
    assert answer["NodeNames"] == []
    assert "CardInsufficientMemory" in answer["FailedNodes"]["a"]
    # the pod's watch event (its decision not written yet) leaves the hold in place
    sched.on_pod("MODIFIED", gpu_pod("p", 6000))
    assert sched.cluster.usage_snapshot() == HELD
    assert sched.explain_pod(gpu_pod("p", 6000))["assigned"] == "a"  # placed, not written


async def test_no_bind_within_the_reservation_timeout_frees_the_devices() -> None:
    ticks = Ticks()
    sched = scheduler(ticks)
    await sched.filter({"Pod": gpu_pod("p", 6000), "NodeNames": ["a"]})
    ticks.value += 30
    assert sched.expire_reservations() == []
    ticks.value += 1
    # the next filter looks at the oldest reservations first: this one is gone
    answer = await sched.filter({"Pod": gpu_pod("q", 6000), "NodeNames": ["a"]})
    assert answer["NodeNames"] == ["a"]
    assert set(sched.cluster.pods) == {"default/q"}
    ticks.value += 31
    assert sched.expire_reservations() == ["default/q"]
    assert sched.cluster.usage_snapshot() == {}


async def test_a_pod_filtered_again_does_not_hold_twice() -> None:
    ticks = Ticks()
    sched = scheduler(ticks)
    for _ in range(2):
        answer = await sched.filter({"Pod": gpu_pod("p", 6000), "NodeNames": ["a"]})
        assert answer["NodeNames"] == ["a"]
    assert sched.cluster.usage_snapshot() == HELD
