"""The scheduler role settles the garbage collector once its initial lists are in
(issue 20 item 2, ``hami.scheduler.heap``), and objects made later are still collected."""

from __future__ import annotations

import copy
import gc
import weakref
from collections.abc import Iterator

import pytest
from _core_helpers import NOW, NVIDIA, gpu, node, pod, register
from _sched_helpers import FakeClock, running_scheduler

from hami.core.cluster import Cluster
from hami.kube.client import Kube
from hami.protocol import ContainerDevice, encode_pod_devices
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
        # (the pages froze already; settle's threshold says settle itself ran)
        await poll(lambda: gc.get_threshold() == heap.THRESHOLD, what="the heap settled")
        assert gc.get_freeze_count() > 0


@pytest.mark.controlplane
async def test_role_groups_nodes_by_summary_before_it_settles(
    kube: Kube, fresh_gc: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first no-fit answer's grouping of every node (0.35 s at 65,000 nodes) is done
    once the lists are in, not by a request."""
    grouped: list[int] = []
    original = Cluster.group_summaries

    def group(cluster: Cluster) -> None:
        grouped.append(gc.get_freeze_count())
        original(cluster)

    monkeypatch.setattr(Cluster, "group_summaries", group)
    async with running_scheduler(kube, FakeClock()):
        await poll(lambda: gc.get_threshold() == heap.THRESHOLD, what="the heap settled")
    assert len(grouped) == 1


def test_grouping_leaves_no_node_for_the_first_no_fit_answer() -> None:
    cluster = Cluster([NVIDIA])
    for i in range(40):
        cluster.upsert_node(node(f"n{i}", register([f"GPU-{i}"])), NOW)
    cluster.refresh(NOW)
    assert cluster.summaries.pending() == 40
    cluster.group_summaries()
    assert cluster.summaries.pending() == 0
    cluster.upsert_pod(
        pod(
            gpu(mem=1000),
            name="p",
            uid="p",
            node_name="n3",
            phase="Running",
            annotations={
                "hami.io/vgpu-node": "n3",
                "hami.io/vgpu-devices-allocated": "GPU-3,NVIDIA,1000,0:;",
            },
        ),
        NOW,
    )
    assert cluster.summaries.pending() == 1  # only the node that changed


def test_freeze_listed_collects_a_pages_garbage_and_freezes_the_rest(fresh_gc: None) -> None:
    kept = _Node()
    garbage = _Node()
    gone = weakref.ref(garbage)
    del garbage
    heap.freeze_listed()
    assert gone() is None  # collected first, not frozen for good
    assert gc.get_freeze_count() > 0
    assert not any(obj is kept for obj in gc.get_objects())  # frozen: never walked again


@pytest.mark.controlplane
async def test_role_freezes_after_each_page_of_the_initial_lists(
    kube: Kube, fresh_gc: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(heap, "freeze_listed", lambda: calls.append(True))
    async with running_scheduler(kube, FakeClock()) as role:
        assert role.scheduler.nodes_synced.is_set() and role.scheduler.pods_synced.is_set()
        assert len(calls) >= 2  # a page of nodes and a page of pods at least
        listed = [r for r in role.reflectors if r.name in ("nodes", "pods")]
        assert len(listed) == 2 and all(r.after_initial_page is not None for r in listed)


def test_an_unchanged_pod_keeps_its_record_and_strings_are_shared() -> None:
    """A relisted pod that holds the same leaves its (frozen) record in place, and the
    decoded ids and names are the node's own strings (interned)."""
    cluster = Cluster([NVIDIA])
    cluster.upsert_node(node("n1", register(["GPU-a", "GPU-b"])), NOW)
    value = encode_pod_devices([[ContainerDevice("GPU-a", "NVIDIA", 1000, 10)]])
    obj = pod(
        gpu(mem=1000, cores=10),
        annotations={"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": value},
        node_name="n1",
        phase="Running",
    )
    cluster.upsert_pod(obj, NOW)
    first = cluster.pods["default/p"]
    cluster.upsert_pod(copy.deepcopy(obj), NOW)
    assert cluster.pods["default/p"] is first
    (uuid,) = first.usage
    assert uuid is cluster.nodes["n1"].devices["GPU-a"].uuid
    assert first.node is cluster.nodes["n1"].name
    assert next(iter(cluster.pods)) is first.key
    changed = copy.deepcopy(obj)
    changed["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = encode_pod_devices(
        [[ContainerDevice("GPU-b", "NVIDIA", 1000, 10)]]
    )
    cluster.upsert_pod(changed, NOW)
    assert cluster.pods["default/p"] is not first
    assert cluster.usage_snapshot()["n1"] == {"GPU-b": (1, 1000, 10)}
