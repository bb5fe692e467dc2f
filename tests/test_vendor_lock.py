"""Go HAMi 2.10's Cambricon node lock, ``cambricon.com/dsmlu.lock``: the value Go writes and
reads (``time.Now().Format(time.RFC3339)``, taken over after two minutes), the bind path's
take and release (``hami.scheduler.vendorlock``), and this node agent removing it after a
pod's allocation as Cambricon's dynamic-sMLU plug-in does. The real control plane runs it in
tests/test_vendor_nodes_controlplane.py (two pods in a row on one node)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from _node_helpers import NODE, MemoryKube, fake_backend
from _node_helpers import pod as node_pod

from hami.backends.cambricon import CambriconBackend
from hami.core.requests import DeviceKind
from hami.node.allocate import AllocateError, Allocator
from hami.protocol import keys
from hami.scheduler.vendorlock import VendorLockError, VendorLocks, free_reason, lock_value

LOCK = "cambricon.com/dsmlu.lock"
NOW = datetime(2026, 5, 20, 10, 0, 0, tzinfo=UTC)
# Go's time.RFC3339 layout: seconds, then Z or a numeric offset
GO_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)$")


def test_the_value_is_gos_layout() -> None:
    value = lock_value(NOW)
    assert value == "2026-05-20T10:00:00Z"
    assert GO_RFC3339.match(value)


@pytest.mark.parametrize(
    ("value", "held"),
    [
        ("2026-05-20T09:59:00Z", True),  # a minute old: Go refuses to bind
        ("2026-05-20T17:59:30+08:00", True),  # Go in a UTC+8 zone writes an offset
        ("2026-05-20T09:57:59Z", False),  # older than two minutes: Go takes it over
        ("2026-05-20T10:01:00Z", True),  # clocks a little apart
        ("2026-05-21T10:00:00Z", False),  # a day ahead: would block the node
        ("test123", False),  # Go's LockNode fails on it forever; taken over here
        ("", False),
    ],
)
def test_a_lock_is_judged_by_its_age_alone(value: str, held: bool) -> None:
    reason = free_reason(value, NOW)
    assert (reason is None) is held, reason
    if not held:
        assert reason  # says why it was taken over


def test_no_lock_is_free_with_nothing_to_say() -> None:
    assert free_reason(None, NOW) == ""


def test_cambricon_binds_under_gos_lock_not_the_mutex() -> None:
    assert CambriconBackend.vendor_lock == LOCK
    assert CambriconBackend.node_lock is False  # Go's NVIDIA LockNode skips MLU pods
    kind = DeviceKind.from_backend(CambriconBackend())
    assert (kind.vendor_lock, kind.node_lock) == (LOCK, False)


class _Clock:
    def __init__(self) -> None:
        self.now = NOW
        self.mono = 0.0
        self.slept = 0

    def monotonic(self) -> float:
        return self.mono


def _locks(kube: MemoryKube, clock: _Clock, on_sleep: Any = None) -> VendorLocks:
    async def sleep(seconds: float) -> None:
        clock.slept += 1
        clock.mono += seconds
        if on_sleep is not None:
            on_sleep()

    return VendorLocks(lambda: kube, lambda: clock.now, clock.monotonic, sleep)  # type: ignore[arg-type, return-value]


def _node_annotations(kube: MemoryKube) -> dict[str, str]:
    result: dict[str, str] = kube.nodes[NODE]["metadata"].get("annotations", {})
    return result


async def test_take_writes_gos_value_and_release_removes_only_ours() -> None:
    kube, clock = MemoryKube(), _Clock()
    fenced: list[int] = []
    locks = _locks(kube, clock)
    value = await locks.take(NODE, LOCK, 10.0, lambda: fenced.append(1))
    assert value == "2026-05-20T10:00:00Z" == _node_annotations(kube)[LOCK]
    assert fenced == [1]  # the fence ran before the write
    kube._merge(kube.nodes[NODE], {LOCK: "2026-05-20T10:00:05Z"})  # taken over meanwhile
    await locks.release(NODE, LOCK, value)
    assert _node_annotations(kube)[LOCK] == "2026-05-20T10:00:05Z"
    await locks.release(NODE, LOCK, "2026-05-20T10:00:05Z")
    assert LOCK not in _node_annotations(kube)


async def test_take_waits_for_the_plugin_to_release_a_live_lock() -> None:
    kube, clock = MemoryKube(), _Clock()
    kube._merge(kube.nodes[NODE], {LOCK: "2026-05-20T09:59:30Z"})

    def plugin_releases() -> None:
        if clock.slept == 3:
            kube._merge(kube.nodes[NODE], {LOCK: None})

    value = await _locks(kube, clock, plugin_releases).take(NODE, LOCK, 10.0, lambda: None)
    assert clock.slept == 3
    assert _node_annotations(kube)[LOCK] == value


async def test_a_held_lock_fails_the_bind_at_its_deadline_naming_the_lock() -> None:
    kube, clock = MemoryKube(), _Clock()
    kube._merge(kube.nodes[NODE], {LOCK: "2026-05-20T09:59:30Z"})
    with pytest.raises(VendorLockError, match=r"is locked by cambricon.com/dsmlu.lock"):
        await _locks(kube, clock).take(NODE, LOCK, 3.0, lambda: None)
    assert _node_annotations(kube)[LOCK] == "2026-05-20T09:59:30Z"  # left as it was


async def test_a_stale_lock_is_taken_over() -> None:
    kube, clock = MemoryKube(), _Clock()
    kube._merge(kube.nodes[NODE], {LOCK: "2026-05-20T09:50:00Z"})
    value = await _locks(kube, clock).take(NODE, LOCK, 3.0, lambda: None)
    assert clock.slept == 0
    assert _node_annotations(kube)[LOCK] == value == "2026-05-20T10:00:00Z"


# ------------------------------------------------------------------ the node agent


def _locked_kube(pod: dict[str, Any]) -> MemoryKube:
    kube = MemoryKube()
    kube.add(pod)
    kube._merge(kube.nodes[NODE], {LOCK: "2026-05-20T09:59:58Z"})
    return kube


async def test_the_agent_removes_the_vendor_lock_after_the_pods_allocation(
    tmp_path: Path,
) -> None:
    kube = _locked_kube(
        node_pod("p", "GPU-u-0,NVIDIA,1000,0:;GPU-u-1,NVIDIA,1000,0:;", containers=2)
    )
    backend = fake_backend(tmp_path)
    backend.vendor_lock = LOCK  # as CambriconBackend declares it
    allocator = Allocator(NODE, kube, now=lambda: NOW)
    first = await allocator.allocate(backend, [1], await backend.enumerate())
    assert not first.done
    assert LOCK in _node_annotations(kube)  # the pod still waits for its second container
    last = await allocator.allocate(backend, [1], await backend.enumerate())
    assert last.done
    assert LOCK not in _node_annotations(kube)
    assert kube.annotations("p")[keys.BIND_PHASE] == "success"


async def test_the_agent_removes_the_vendor_lock_when_the_pod_fails(tmp_path: Path) -> None:
    kube = _locked_kube(node_pod("p", "GPU-elsewhere,NVIDIA,1000,0:;"))
    backend = fake_backend(tmp_path)
    backend.vendor_lock = LOCK
    allocator = Allocator(NODE, kube, now=lambda: NOW)
    with pytest.raises(AllocateError):
        await allocator.allocate(backend, [1], await backend.enumerate())
    assert kube.annotations("p")[keys.BIND_PHASE] == "failed"
    assert LOCK not in _node_annotations(kube)


async def test_a_backend_without_a_vendor_lock_leaves_the_annotation(tmp_path: Path) -> None:
    kube = _locked_kube(node_pod("p", "GPU-u-0,NVIDIA,1000,0:;"))
    backend = fake_backend(tmp_path)
    allocator = Allocator(NODE, kube, now=lambda: NOW)
    assert (await allocator.allocate(backend, [1], await backend.enumerate())).done
    assert LOCK in _node_annotations(kube)
