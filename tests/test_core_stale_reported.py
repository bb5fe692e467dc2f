"""A stale ``Reported`` never drops a live node (issue 18 item 5).

protocol.md §2 keeps a type whose stamps expired while kubelet advertises its count
resource, unless its agent heartbeats. Before, any ``Reported`` value ever seen marked the
agent as one that heartbeats, for good: a node whose Go HAMi <= 2.7 plugin was upgraded to
one that never heartbeats (>= 2.8), leaving one old ``Reported`` stamp, was dropped 75 s
later and stayed out until the scheduler restarted. Now a ``Reported`` value counts by its
age (its own time, never later than when it was first seen) for 2 handshake timeouts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _core_helpers import NOW, NVIDIA, node, register

from hami.core.cluster import Cluster
from hami.protocol import handshake
from hami.protocol.handshake import reported_time

GO_KEY = "hami.io/node-handshake"
TIMEOUT = timedelta(seconds=60)


def cluster() -> Cluster:
    return Cluster([NVIDIA], handshake_timeout=TIMEOUT)


def go_node(shake: str, *, allocatable: str | None = "1", value: str | None = None) -> Any:
    """A node of Go HAMi's plugin: its handshake under Go's key, kubelet's resources."""
    obj = node("a", value or register(["GPU-a0"]), shake=None, extra={GO_KEY: shake})
    if allocatable is not None:
        obj["status"] = {
            "capacity": {"nvidia.com/gpu": "1"},
            "allocatable": {"nvidia.com/gpu": allocatable},
        }
    return obj


def available(c: Cluster) -> bool:
    return c.nodes["a"].types["nvidia"].available


def run_passes(c: Cluster, start: datetime, seconds: int, **node_kwargs: Any) -> list[bool]:
    """Handshake passes every 15 s, the Node as each pass leaves it; availability after each."""
    seen: list[bool] = []
    for step in range(0, seconds + 1, 15):
        now = start + timedelta(seconds=step)
        writes, _ = c.refresh(now)
        for write in writes:
            c.upsert_node(go_node(write.annotations[GO_KEY], **node_kwargs), now)
        seen.append(available(c))
    return seen


def stamp(at: datetime) -> str:
    return handshake.reported(at)


def test_an_old_reported_stamp_never_drops_a_node_that_kubelet_advertises() -> None:
    c = cluster()
    old = stamp(NOW - timedelta(hours=1))  # left by a Go HAMi <= 2.7 plugin long ago
    c.upsert_node(go_node(old), NOW)
    # Before: "handshake timed out" from the pass at 75 s on, for good.
    assert all(run_passes(c, NOW, 600))
    # kubelet's "no" still wins at once, and its "yes" brings the node back at once
    later = NOW + timedelta(seconds=615)
    requesting = handshake.requesting(NOW)
    c.upsert_node(go_node(requesting, allocatable="0"), later)
    assert not available(c)
    c.upsert_node(go_node(requesting), later)
    assert available(c)


def test_a_reported_still_on_the_node_after_the_plugin_reregisters_is_no_heartbeat() -> None:
    """The upgrade itself: the <= 2.7 plugin's last Reported is still there when the new
    plugin writes its (JSON) register value; that event shows no new heartbeat."""
    c = cluster()
    last = stamp(NOW - timedelta(seconds=1))
    c.upsert_node(go_node(last), NOW)
    json = '[{"id":"GPU-a0","count":10,"devmem":32768,"devcore":100,"type":"NVIDIA","health":true}]'
    c.upsert_node(go_node(last, value=json), NOW + timedelta(seconds=2))
    assert all(run_passes(c, NOW + timedelta(seconds=2), 300, value=json))


def test_an_agent_that_goes_silent_is_dropped_then_back_once_its_last_reported_is_old() -> None:
    c = cluster()
    c.upsert_node(go_node(stamp(NOW)), NOW)
    seen = run_passes(c, NOW, 180)  # passes at 0, 15, ... 180 s
    # the §2 table: out once its Requesting_ stamp (written at 0 s) is over 60 s old; back
    # at the first pass after its Reported is over 2 x 60 s old (before: out for good)
    assert seen == [True] * 5 + [False] * 4 + [True] * 4
    # kubelet not advertising the type: the table alone, out for good
    c = cluster()
    c.upsert_node(go_node(stamp(NOW), allocatable=None), NOW)
    assert run_passes(c, NOW, 600, allocatable=None)[-1] is False


def test_a_heartbeat_is_judged_once_and_never_later_than_when_it_was_first_seen() -> None:
    # unreadable time, and one far ahead of the scheduler's clock: both from first sight
    for shake in ("Reported_garbage", "Reported_9999-12-31 23:59:59"):
        c = cluster()
        c.upsert_node(go_node(shake), NOW)
        c.refresh(NOW)
        # the same value shown again later is not a new heartbeat
        c.upsert_node(go_node(shake), NOW + timedelta(seconds=110))
        c.refresh(NOW + timedelta(seconds=110))
        c.upsert_node(go_node(handshake.requesting(NOW)), NOW + timedelta(seconds=111))
        assert not available(c)
        c.refresh(NOW + timedelta(seconds=121))
        assert available(c)


def test_an_agent_that_keeps_heartbeating_is_never_judged_by_allocatable() -> None:
    c = cluster()
    for step in range(0, 600, 30):
        now = NOW + timedelta(seconds=step)
        c.upsert_node(go_node(stamp(now)), now)
        c.refresh(now)
        assert available(c)
    # it stops; 61 s after the scheduler's last stamp the table drops it, kubelet or not
    last = NOW + timedelta(seconds=570)
    c.upsert_node(go_node(handshake.requesting(last)), last)
    c.refresh(last + timedelta(seconds=61))
    assert not available(c)
    assert c.nodes["a"].types["nvidia"].reason == handshake.HANDSHAKE_TIMED_OUT


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Reported_2024-01-23 04:30:04", datetime(2024, 1, 23, 4, 30, 4, tzinfo=UTC)),
        ("Reported 2024.01.23 04:30:04", datetime(2024, 1, 23, 4, 30, 4, tzinfo=UTC)),
        # Go's time.Time.String(), as Go HAMi's older plugins wrote it
        (
            "Reported 2024-01-23 12:30:04.5 +0800 CST m=+3.1",
            datetime(2024, 1, 23, 4, 30, 4, tzinfo=UTC),
        ),
        ("Reported 2024-01-23 00:00:04 -0430 X", datetime(2024, 1, 23, 4, 30, 4, tzinfo=UTC)),
        ("Reported_0001-01-01 00:00:00 +0100", datetime(1, 1, 1, tzinfo=UTC)),
        ("Reported_", None),
        ("Reported_yesterday", None),
        ("Requesting_2024-01-23 04:30:04", None),
        ("Reportedly 2024-01-23 04:30:04", None),
        (None, None),
    ],
)
def test_reported_time(value: str | None, expected: datetime | None) -> None:
    assert reported_time(value) == expected
