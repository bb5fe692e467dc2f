"""hami.kube against the real kube-apiserver: patches, conflicts, bind, events, reflector."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from hami.kube.client import Kube
from hami.kube.events import emit_pod_event
from hami.kube.objects import annotations_of
from hami.kube.raw import JSON, Conflict, Gone, KubeError, NotFound
from hami.kube.reflector import Reflector, object_key
from hami.testkit.cluster import poll

pytestmark = pytest.mark.controlplane


def _pod(name: str, namespace: str, node: str | None = None) -> JSON:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def _node(kube: Kube, name: str) -> JSON:
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    return await kube.request("POST", "/api/v1/nodes", body=body)


async def test_merge_patch_sets_and_deletes_annotations(kube: Kube) -> None:
    name = f"n-{uuid.uuid4().hex[:8]}"
    await _node(kube, name)
    try:
        await kube.patch_node_annotations(name, {"a": "1", "b": "2"})
        node = await kube.patch_node_annotations(name, {"a": None})
        assert annotations_of(node) == {"b": "2"}
    finally:
        await kube.request("DELETE", f"/api/v1/nodes/{name}")


async def test_resource_version_guard_raises_conflict(kube: Kube) -> None:
    name = f"n-{uuid.uuid4().hex[:8]}"
    created = await _node(kube, name)
    stale = created["metadata"]["resourceVersion"]
    try:
        await kube.patch_node_annotations(name, {"x": "first"}, stale)
        with pytest.raises(Conflict):
            await kube.patch_node_annotations(name, {"x": "second"}, stale)
        assert annotations_of(await kube.get_node(name))["x"] == "first"
    finally:
        await kube.request("DELETE", f"/api/v1/nodes/{name}")


async def test_missing_objects_raise_not_found(kube: Kube) -> None:
    with pytest.raises(NotFound):
        await kube.get_pod("default", "no-such-pod")


async def test_bind_and_event(kube: Kube, namespace: str) -> None:
    node = f"n-{uuid.uuid4().hex[:8]}"
    await _node(kube, node)
    try:
        created = await kube.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods", body=_pod("p", namespace)
        )
        uid = created["metadata"]["uid"]
        await kube.bind_pod(namespace, "p", uid, node)
        bound = await kube.get_pod(namespace, "p")
        assert bound["spec"]["nodeName"] == node
        with pytest.raises(KubeError):  # a pod binds once
            await kube.bind_pod(namespace, "p", uid, node)
        assert await emit_pod_event(kube, bound, "FilteringSucceed", "chose " + node)
        events = await kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
        assert [(e["reason"], e["involvedObject"]["name"]) for e in events["items"]] == [
            ("FilteringSucceed", "p")
        ]
        listed = await kube.list_pods(field_selector=f"spec.nodeName={node}")
        assert [object_key(p) for p in listed] == [f"{namespace}/p"]
    finally:
        await kube.request("DELETE", f"/api/v1/nodes/{node}")


async def test_reflector_lists_watches_and_reports_deletes(kube: Kube, namespace: str) -> None:
    seen: dict[str, JSON] = {}
    log: list[tuple[str, str]] = []

    def handler(kind: str, obj: JSON) -> None:
        key = object_key(obj)
        log.append((kind, key))
        if kind == "DELETED":
            seen.pop(key, None)
        else:
            seen[key] = obj

    pods = f"/api/v1/namespaces/{namespace}/pods"
    await kube.request("POST", pods, body=_pod("before", namespace))
    reflector = Reflector(kube, pods, handler, name="test")
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), 10)
        assert set(seen) == {f"{namespace}/before"}
        await kube.request("POST", pods, body=_pod("after", namespace))
        await poll(lambda: f"{namespace}/after" in seen)
        await kube.patch_pod_annotations(namespace, "after", {"k": "v"})
        await poll(lambda: annotations_of(seen[f"{namespace}/after"]).get("k") == "v")
        await kube.request("DELETE", f"{pods}/before", query=[("gracePeriodSeconds", 0)])
        await poll(lambda: f"{namespace}/before" not in seen)
        before = len(log)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Objects deleted while the reflector was down still arrive as DELETED on re-list.
        await kube.request("DELETE", f"{pods}/after", query=[("gracePeriodSeconds", 0)])
        task = asyncio.create_task(reflector.run())
        await poll(lambda: f"{namespace}/after" not in seen)
        assert ("DELETED", f"{namespace}/after") in log[before:]
        assert seen == {}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_reflector_relists_after_gone(kube: Kube, namespace: str) -> None:
    kinds: list[str] = []
    pods = f"/api/v1/namespaces/{namespace}/pods"
    reflector = Reflector(kube, pods, lambda kind, obj: kinds.append(kind), name="gone")
    # The API server's way of saying a watch version was compacted away.
    with pytest.raises(Gone):
        reflector._on_event({"type": "ERROR", "object": {"kind": "Status", "code": 410}})
    await kube.request("POST", pods, body=_pod("a", namespace))
    lists = 0
    real_list, real_watch = reflector._list, reflector._watch

    async def counting_list() -> None:
        nonlocal lists
        lists += 1
        await real_list()

    async def watch_gone_once() -> None:
        if lists == 1:
            raise Gone(410, "Gone", "too old resource version", pods)
        await real_watch()

    reflector._list = counting_list  # type: ignore[method-assign]
    reflector._watch = watch_gone_once  # type: ignore[method-assign]
    task = asyncio.create_task(reflector.run())
    try:
        await poll(lambda: lists == 2)
        await kube.request("POST", pods, body=_pod("b", namespace))
        await poll(lambda: kinds.count("ADDED") == 2)
        assert kinds == ["ADDED", "ADDED"]  # the re-list repeated nothing
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_reflector_lists_in_pages(kube: Kube, namespace: str) -> None:
    """A big cluster's list arrives a page at a time (limit/continue), and the watch goes on
    from the whole list's resourceVersion."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for name in ("a", "b", "c"):
        await kube.request("POST", pods, body=_pod(name, namespace))
    seen: list[str] = []
    reflector = Reflector(
        kube,
        pods,
        lambda kind, obj: seen.append(f"{kind} {obj['metadata']['name']}"),
        name="paged",
        page_size=1,
    )
    pages: list[str] = []
    real_request = kube.request

    async def counting_request(method: str, path: str, **kwargs: Any) -> JSON:
        answer = await real_request(method, path, **kwargs)
        if path == pods and ("watch", "true") not in kwargs.get("query", ()):
            pages.append(str(answer["metadata"].get("continue") or ""))
        return answer

    kube.request = counting_request  # type: ignore[method-assign]
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), 20)
        assert sorted(seen) == ["ADDED a", "ADDED b", "ADDED c"]
        assert len(pages) == 3 and pages[-1] == ""  # three pages, the last without a token
        await real_request("POST", pods, body=_pod("d", namespace))
        await poll(lambda: "ADDED d" in seen)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
