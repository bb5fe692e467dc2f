"""Releasing the node lock after the last Allocate: one Node read per call, and a node that
changed in between (a heartbeat patch) is re-read rather than left locked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from test_node_unit import NODE, MemoryKube, fake_backend
from test_node_unit import pod as node_pod

from hami.node.allocate import Allocator, KubeCalls
from hami.protocol import keys

NOW = datetime(2024, 5, 20, 10, tzinfo=UTC)


class StaleRv(Exception):
    pass


def guarded(kube: MemoryKube, calls: Counter[str], *, bump_after_pod_patch: bool) -> KubeCalls:
    """MemoryKube's calls, counting them and enforcing resourceVersion on node patches."""
    inner = kube.calls()
    state = {"rv": 1}

    async def get_node(name: str) -> dict[str, Any]:
        calls["get_node"] += 1
        node = await inner.get_node(name)
        node["metadata"]["resourceVersion"] = str(state["rv"])
        return {**node, "metadata": dict(node["metadata"])}

    async def patch_node(name: str, annotations: Mapping[str, str | None], rv: str | None) -> Any:
        calls["patch_node"] += 1
        if rv is not None and rv != str(state["rv"]):
            raise StaleRv(rv)
        state["rv"] += 1
        return await inner.patch_node(name, annotations, rv)

    async def patch_pod(ns: str, name: str, annotations: Mapping[str, str | None]) -> Any:
        calls["patch_pod"] += 1
        if bump_after_pod_patch:
            state["rv"] += 1  # the node agent's heartbeat lands meanwhile
        return await inner.patch_pod(ns, name, annotations)

    return KubeCalls(
        get_node,
        inner.get_pod,
        inner.list_pods,
        patch_node,
        patch_pod,
        is_not_found=inner.is_not_found,
        is_conflict=lambda exc: isinstance(exc, StaleRv),
    )


async def _allocate_one(tmp_path: Path, *, bump: bool) -> tuple[MemoryKube, Counter[str]]:
    kube = MemoryKube()
    kube.add(node_pod("p", "GPU-u-0,NVIDIA,1000,0:;"))
    kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: "2024-05-20T10:00:00Z,ns,p"})
    calls: Counter[str] = Counter()
    backend = fake_backend(tmp_path)
    allocator = Allocator(NODE, guarded(kube, calls, bump_after_pod_patch=bump), now=lambda: NOW)
    plan = await allocator.allocate(backend, [1], await backend.enumerate())
    assert plan.done
    return kube, calls


async def test_last_allocate_reuses_its_node_read_to_release_the_lock(tmp_path: Path) -> None:
    kube, calls = await _allocate_one(tmp_path, bump=False)
    assert keys.NODE_LOCK not in kube.nodes[NODE]["metadata"].get("annotations", {})
    assert calls == Counter(get_node=1, patch_pod=1, patch_node=1)


async def test_lock_release_rereads_a_node_that_changed(tmp_path: Path) -> None:
    kube, calls = await _allocate_one(tmp_path, bump=True)
    assert keys.NODE_LOCK not in kube.nodes[NODE]["metadata"].get("annotations", {})
    assert calls == Counter(get_node=2, patch_pod=1, patch_node=2)
