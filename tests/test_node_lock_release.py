"""Releasing the node lock after the last Allocate: one Node read per call, and a node that
changed in between (a heartbeat patch) is re-read rather than left locked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from _node_helpers import NODE, MemoryKube, fake_backend
from _node_helpers import pod as node_pod

from hami.kube.client import node_path
from hami.kube.raw import JSON, Conflict
from hami.node.allocate import Allocator
from hami.protocol import keys

NOW = datetime(2024, 5, 20, 10, tzinfo=UTC)


class GuardedKube(MemoryKube):
    """Counts the calls and enforces resourceVersion on node patches (409 Conflict)."""

    def __init__(self, *, bump_after_pod_patch: bool) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.node_rv = 1
        self.bump_after_pod_patch = bump_after_pod_patch

    async def get_node(self, name: str) -> JSON:
        self.calls["get_node"] += 1
        node = await super().get_node(name)
        return {**node, "metadata": {**node["metadata"], "resourceVersion": str(self.node_rv)}}

    async def patch_node_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> JSON:
        self.calls["patch_node"] += 1
        if resource_version is not None and resource_version != str(self.node_rv):
            raise Conflict(409, "Conflict", "the object has been modified", node_path(name))
        self.node_rv += 1
        return await super().patch_node_annotations(name, annotations, resource_version)

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> JSON:
        self.calls["patch_pod"] += 1
        if self.bump_after_pod_patch:
            self.node_rv += 1  # the node agent's heartbeat lands meanwhile
        return await super().patch_pod_annotations(namespace, name, annotations)


async def _allocate_one(tmp_path: Path, *, bump: bool) -> GuardedKube:
    kube = GuardedKube(bump_after_pod_patch=bump)
    kube.add(node_pod("p", "GPU-u-0,NVIDIA,1000,0:;"))
    kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: "2024-05-20T10:00:00Z,ns,p"})
    backend = fake_backend(tmp_path)
    allocator = Allocator(NODE, kube, now=lambda: NOW)
    plan = await allocator.allocate(backend, [1], await backend.enumerate())
    assert plan.done
    return kube


async def test_last_allocate_reuses_its_node_read_to_release_the_lock(tmp_path: Path) -> None:
    kube = await _allocate_one(tmp_path, bump=False)
    assert keys.NODE_LOCK not in kube.nodes[NODE]["metadata"].get("annotations", {})
    assert kube.calls == Counter(get_node=1, patch_pod=1, patch_node=1)


async def test_lock_release_rereads_a_node_that_changed(tmp_path: Path) -> None:
    kube = await _allocate_one(tmp_path, bump=True)
    assert keys.NODE_LOCK not in kube.nodes[NODE]["metadata"].get("annotations", {})
    assert kube.calls == Counter(get_node=2, patch_pod=1, patch_node=2)
