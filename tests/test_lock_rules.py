"""The node lock's one staleness rule (hami.kube.nodelock), as the scheduler's bind and
filter and the node agent use it: absurd times, the legacy owner-less form, and a holder
that lost its Allocate. Pure, with an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hami.config import SchedulerConfig
from hami.kube.nodelock import LockRules, held_longer_than, judge_holder, judge_value
from hami.kube.raw import NotFound
from hami.node.allocate import choose_pod
from hami.protocol import keys, parse_lock
from hami.protocol.nodelock import NodeLock, parse_unix_time
from hami.scheduler.locks import MAX_HOLDERS
from hami.scheduler.service import Clock, Scheduler

NOW = datetime(2024, 5, 20, 10, 0, 0, tzinfo=UTC)
RULES = LockRules(timedelta(minutes=5), timedelta(seconds=60))
NODE = "node-l"


def at(offset: float) -> datetime:
    return NOW + timedelta(seconds=offset)


def stamp(time: datetime) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ")


def holder(
    *,
    bound: str | None = NODE,
    placed: str | None = NODE,
    phase: str | None = "allocating",
    bind_time: str | None = None,
    status: str = "Pending",
    deleting: bool = False,
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if placed:
        annotations[keys.VGPU_NODE] = placed
    if phase:
        annotations[keys.BIND_PHASE] = phase
    if bind_time is not None:
        annotations[keys.BIND_TIME] = bind_time
    meta: dict[str, Any] = {"namespace": "ns", "name": "a", "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = stamp(NOW)
    spec = {"nodeName": bound} if bound else {}
    return {"metadata": meta, "spec": spec, "status": {"phase": status}}


# ------------------------------------------------------------------ absurd times


def test_a_lock_in_year_9999_is_stale_not_an_overflow() -> None:
    value = "9999-12-31T23:59:59Z,ns,a"
    lock = parse_lock(value)
    assert lock is not None
    assert lock.is_expired(NOW)  # was OverflowError: adding the timeout passes year 9999
    view = judge_value(value, NOW, RULES)
    assert view.free and "absurd" in view.reason
    # an offset that moves it past year 9999 is unparsable, hence stale
    assert parse_lock("9999-12-31T23:59:59-01:00,ns,a") is None
    assert judge_value("9999-12-31T23:59:59-01:00,ns,a", NOW, RULES).free
    # a day ahead is absurd; a minute ahead (clock skew) is held
    assert judge_value(f"{stamp(at(86400))},ns,a", NOW, RULES).free
    assert not judge_value(f"{stamp(at(60))},ns,a", NOW, RULES).free


def test_absurd_bind_times_do_not_break_the_allocate_order() -> None:
    def pod(name: str, bind_time: str) -> dict[str, Any]:
        p = holder(bind_time=bind_time)
        p["metadata"]["name"] = name
        p["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] = "GPU-0,NVIDIA,1,0:;"
        return p

    huge, normal = pod("huge", "9" * 40), pod("normal", "1716199325")
    assert choose_pod(NODE, "hami.io/vgpu-devices-to-allocate", None, [huge, normal]) is normal
    assert parse_unix_time("9" * 19) is None  # past year 9999
    assert parse_unix_time("-5") is None
    assert parse_unix_time("1716199325") == datetime(2024, 5, 20, 10, 2, 5, tzinfo=UTC)


# ------------------------------------------------------------------ legacy form


def test_legacy_owner_less_lock_is_honoured_until_the_lock_timeout() -> None:
    value = "2024-05-20T12:00:00+02:00"  # Go HAMi: a bare time, local zone offset
    lock = parse_lock(value)
    assert lock == NodeLock(NOW, "", "") and lock.owner is None
    view = judge_value(value, at(299), RULES)
    assert not view.free and not view.needs_pod
    assert judge_value(value, at(301), RULES).free


# ------------------------------------------------------------------ the holder


def test_a_holder_without_allocation_progress_is_stale_and_failed() -> None:
    lock = NodeLock(NOW, "ns", "a")
    pod = holder(bind_time=str(int(NOW.timestamp())))
    assert not judge_holder(lock, pod, NODE, at(60), RULES).stale
    verdict = judge_holder(lock, pod, NODE, at(61), RULES)
    assert verdict.stale and verdict.fail_holder and "no allocation progress" in verdict.reason
    # measured from the later bind-time
    later = holder(bind_time=str(int(at(30).timestamp())))
    assert not judge_holder(lock, later, NODE, at(61), RULES).stale
    assert judge_holder(lock, later, NODE, at(91), RULES).stale
    # an absurd bind-time is ignored: measured from the lock
    assert judge_holder(lock, holder(bind_time="9" * 30), NODE, at(61), RULES).stale
    # a holder never bound (its scheduler died before the Binding) is stale, not failed
    unbound = judge_holder(lock, holder(bound=None), NODE, at(61), RULES)
    assert unbound.stale and not unbound.fail_holder


def test_holder_table() -> None:
    lock = NodeLock(NOW, "ns", "a")
    cases: list[tuple[Mapping[str, Any] | None, str]] = [
        (None, "no longer exists"),
        (holder(deleting=True), "being deleted"),
        (holder(status="Failed"), "finished (Failed)"),
        (holder(phase="success"), "ended (success)"),
        (holder(phase="failed"), "ended (failed)"),
        (holder(bound="other"), "bound to node other"),
        (holder(bound=None, placed="other"), "placed on node other"),
    ]
    for pod, reason in cases:
        verdict = judge_holder(lock, pod, NODE, NOW, RULES)
        assert verdict.stale and reason in verdict.reason and not verdict.fail_holder
    assert not judge_holder(lock, holder(), NODE, at(10), RULES).stale


def test_filter_tries_long_held_nodes_last() -> None:
    lock = NodeLock(NOW, "ns", "a")
    after = timedelta(seconds=10)
    assert not held_longer_than(lock, at(5), RULES, after, "ns/b")
    assert held_longer_than(lock, at(11), RULES, after, "ns/b")
    assert not held_longer_than(lock, at(11), RULES, after, "ns/a")  # its own
    assert not held_longer_than(lock, at(301), RULES, after, "ns/b")  # expired: free
    assert not held_longer_than(None, at(11), RULES, after, "ns/b")


# ------------------------------------------------------------------ fuzzing the uses

_offsets = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59).map(
    lambda m: timezone(timedelta(minutes=m))
)
_times = st.builds(
    lambda t, tz: t.replace(tzinfo=tz).isoformat(),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    _offsets,
) | st.sampled_from(["9999-12-31T23:59:59Z", "0001-01-01T00:00:00+23:59", "2024-05-20T10:00:00Z"])
_names = st.sampled_from(["ns", "a", "me", "", "x y", "ü"])
_lock_values = (
    st.builds(lambda t, ns, p: f"{t},{ns},{p}", _times, _names, _names)
    | _times
    | st.text(max_size=40)
    | st.none()
)
_bind_times = st.none() | st.text(max_size=25) | st.integers(-(2**70), 2**70).map(str)


@settings(max_examples=300, deadline=None)
@given(
    value=_lock_values,
    bind_time=_bind_times,
    phase=st.sampled_from([None, "allocating", "success", "failed", "junk"]),
    bound=st.sampled_from([None, NODE, "other"]),
    exists=st.booleans(),
    offset=st.integers(-(10**6), 10**6),
)
def test_any_lock_value_gives_the_scheduler_a_decision(
    value: str | None,
    bind_time: str | None,
    phase: str | None,
    bound: str | None,
    exists: bool,
    offset: int,
) -> None:
    now = at(offset)
    pod = holder(bound=bound, phase=phase, bind_time=bind_time) if exists else None
    view = judge_value(value, now, RULES, me="ns/me")
    if view.needs_pod:
        assert view.lock is not None
        judge_holder(view.lock, pod, NODE, now, RULES)
    lock = parse_lock(value)
    held_longer_than(lock, now, RULES, timedelta(seconds=10), "ns/me")
    assert isinstance(_scheduler_decision(value, pod, now), NodeLock | None)


class StubKube:
    """The scheduler's API calls over one Node and one (maybe missing) lock holder pod;
    every patch succeeds."""

    def __init__(self, node: dict[str, Any] | None, pod: dict[str, Any] | None) -> None:
        self.node = node
        self.pod = pod

    async def get_node(self, name: str) -> dict[str, Any]:
        assert self.node is not None
        return self.node

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        if self.pod is None:
            raise NotFound(404, "NotFound", "not found", "/pods")
        return self.pod

    async def patch_pod_annotations(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    async def patch_node_annotations(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


def _scheduler(kube: StubKube, now: datetime) -> Scheduler:
    scheduler = Scheduler(
        SchedulerConfig(),
        [],
        kube,  # type: ignore[arg-type]
        clock=Clock(now=lambda: now),
        emit_events=False,
    )
    return scheduler


def _scheduler_decision(value: str | None, pod: dict[str, Any] | None, now: datetime) -> Any:
    """``NodeLocks.live_holder`` (bind's lock decision) with the API calls stubbed."""
    scheduler = _scheduler(StubKube(None, pod), now)
    return asyncio.run(scheduler.locks.live_holder(value, NODE, "ns", "me"))


@settings(max_examples=200, deadline=None)
@given(value=_lock_values, offset=st.integers(-(10**6), 10**6), exists=st.booleans())
def test_any_lock_on_a_node_passes_the_watch_and_the_sweep(
    value: str | None, offset: int, exists: bool
) -> None:
    """Node watch event -> the scheduler's parsed lock -> the periodic sweep: no exception."""
    now = at(offset)
    annotations = {keys.NODE_LOCK: value} if value is not None else {}
    node = {"metadata": {"name": NODE, "resourceVersion": "7", "annotations": annotations}}
    pod = holder(bind_time=str(int(NOW.timestamp()))) if exists else None
    scheduler = _scheduler(StubKube(node, pod), now)

    async def run() -> None:
        scheduler.on_node("ADDED", node)
        await scheduler.release_stale_locks()

    asyncio.run(run())


# ------------------------------------------------------------------ the release on its way


def test_a_holder_whose_allocation_ended_is_waited_on_for_its_release() -> None:
    """Its node agent wrote ``success`` and releases the lock next: within the grace the
    lock still blocks (a write over it would race the release into a 409); after it, or
    without a grace (the sweep, the node agent), it is taken over as before."""
    ticks = [100.0]
    lock = NodeLock(NOW, "ns", "a").encode()
    scheduler = Scheduler(
        SchedulerConfig(),
        [],
        StubKube(None, holder(phase="success")),  # type: ignore[arg-type]
        clock=Clock(now=lambda: NOW, monotonic=lambda: ticks[0]),
        emit_events=False,
    )
    locks = scheduler.locks

    def judged(grace: float) -> NodeLock | None:
        return asyncio.run(locks.live_holder(lock, NODE, "ns", "me", release_grace=grace))

    assert judged(0.0) is None
    assert judged(1.0) is not None
    ticks[0] += 0.9
    assert judged(1.0) is not None
    ticks[0] += 0.2
    assert judged(1.0) is None  # no release came: taken over
    # a change of the lock on that node starts the grace again for the next value
    assert locks.node_seen(NODE, "8", lock, None)
    assert judged(1.0) is not None


def test_the_holders_since_the_last_check_follow_the_node_watch() -> None:
    """What lets a bind skip its list of the node's pods: the lock holders the Node watch
    showed since this replica's last check; unknown again after a relist, a node removed,
    or a lock naming no pod."""
    scheduler = _scheduler(StubKube(None, None), NOW)
    locks = scheduler.locks
    first = NodeLock(NOW, "ns", "a").encode()
    second = NodeLock(NOW, "ns", "b").encode()
    assert locks.node_seen(NODE, "1", None, first)
    assert NODE not in locks.holders  # no check yet: not known
    locks.checked(NODE, "ns/a")
    assert locks.node_seen(NODE, "2", first, None)
    assert locks.node_seen(NODE, "3", None, second)
    assert locks.holders[NODE] == ["ns/a", "ns/b"]
    locks.lost_track()
    assert NODE not in locks.holders
    locks.checked(NODE, "ns/b")
    assert locks.node_seen(NODE, "4", second, f"{stamp(NOW)}")  # the legacy owner-less form
    assert NODE not in locks.holders
    locks.checked(NODE, "ns/c")
    assert locks.node_seen(NODE, "5", None, "not a lock")
    assert NODE not in locks.holders
    locks.checked(NODE, "ns/c")
    locks.forget(NODE)
    assert NODE not in locks.holders
    # a node where others bind over and over: the history stays bounded
    locks.checked(NODE, "ns/c")
    previous: str | None = None
    for i in range(MAX_HOLDERS + 1):
        value = NodeLock(NOW, "ns", f"p{i}").encode()
        locks.node_seen(NODE, str(10 + i), previous, value)
        previous = value
    assert NODE not in locks.holders
