"""The scheduler role settles the garbage collector once its initial lists are in
(issue 20 item 2, ``hami.scheduler.heap``), and objects made later are still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from _sched_helpers import FakeClock, running_scheduler

from hami.kube.client import Kube
from hami.scheduler import heap
from hami.testkit.cluster import poll


@pytest.fixture
def fresh_gc() -> Iterator[None]:
    """Nothing frozen and CPython's thresholds before; the same after (process-wide)."""
    threshold = gc.get_threshold()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class _Node:
    """A stand-in for cluster state: a reference cycle, so only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_settle_freezes_what_exists_and_later_garbage_is_collected(fresh_gc: None) -> None:
    before = _Node()
    heap.settle()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == heap.THRESHOLD
    assert not any(obj is before for obj in gc.get_objects())  # frozen: never walked
    later = _Node()
    gone = weakref.ref(later)
    del later
    gc.collect()
    assert gone() is None


@pytest.mark.controlplane
async def test_role_settles_the_heap_after_both_lists(kube: Kube, fresh_gc: None) -> None:
    async with running_scheduler(kube, FakeClock()) as role:
        assert role.scheduler.nodes_synced.is_set() and role.scheduler.pods_synced.is_set()
        await poll(lambda: gc.get_freeze_count() > 0, what="the heap frozen after sync")
        assert gc.get_threshold() == heap.THRESHOLD
