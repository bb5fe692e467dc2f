"""Issue 20 item 2: the reflector hands each list page over as it arrives instead of
holding the whole list, and a relist still ends with exactly the server's objects.

The page logic runs against a fake paged source (pages and failures scripted); the real
kube-apiserver cases are in the second half."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hami.kube.client import Kube, Page
from hami.kube.raw import JSON, Gone, KubeError
from hami.kube.reflector import HAND_OVER_BATCH, Reflector, object_key

Step = list[JSON] | Exception


class _Items(list[JSON]):
    """A page's items that a weak reference can watch (a plain list cannot)."""


class FakeKube:
    """Serves each list from a script: one step per page, an exception fails the list
    there (after the pages before it). The watch stays open and silent."""

    def __init__(self) -> None:
        self.lists: list[list[Step]] = []
        self.pages_served = 0
        self.watching = asyncio.Event()
        self.served: list[weakref.ref[_Items]] = []  # each page's items, watched

    async def list_pages(self, path: str, **kwargs: Any) -> AsyncIterator[Page]:
        steps = self.lists.pop(0)
        for n, step in enumerate(steps):
            await asyncio.sleep(0)  # a page arrives later, as over the wire
            if isinstance(step, Exception):
                raise step
            self.pages_served += 1
            yield self._page(step, n == len(steps) - 1)  # bound to no name here

    def _page(self, items: list[JSON], last: bool) -> Page:
        page = Page(_Items(items), "7", last)
        self.served.append(weakref.ref(page.items))  # type: ignore[arg-type]
        return page

    @contextlib.asynccontextmanager
    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[AsyncIterator[JSON]]:
        async def quiet() -> AsyncIterator[JSON]:
            self.watching.set()
            await asyncio.Event().wait()
            yield {}

        yield quiet()


def _node(name: str, version: str) -> JSON:
    return {"metadata": {"name": name, "resourceVersion": version}}


class Store:
    """What a consumer builds from the events: key -> resourceVersion, and the events."""

    def __init__(self) -> None:
        self.objects: dict[str, str] = {}
        self.events: list[str] = []

    def __call__(self, kind: str, obj: JSON) -> None:
        key = object_key(obj)
        self.events.append(f"{kind} {key}")
        if kind == "DELETED":
            del self.objects[key]  # a DELETED for an unknown key would be a bug: KeyError
        else:
            self.objects[key] = obj["metadata"]["resourceVersion"]


def _reflector(kube: FakeKube, store: Store, **kwargs: Any) -> Reflector:
    return Reflector(kube, "/api/v1/nodes", store, name="nodes", max_backoff=0.01, **kwargs)  # type: ignore[arg-type]


async def _listed(refl: Reflector) -> None:
    await refl._list()


async def test_a_relist_across_pages_ends_with_exactly_the_servers_objects() -> None:
    kube, store = FakeKube(), Store()
    refl = _reflector(kube, store)
    kube.lists.append([[_node("a", "1"), _node("b", "1")], [_node("c", "1"), _node("d", "1")]])
    await _listed(refl)
    assert store.objects == {"a": "1", "b": "1", "c": "1", "d": "1"}
    # The relist: a and c are gone, b changed, d unchanged, e and f new; three pages.
    kube.lists.append([[_node("b", "2")], [_node("d", "1"), _node("e", "1")], [_node("f", "1")]])
    store.events.clear()
    await _listed(refl)
    assert store.objects == {"b": "2", "d": "1", "e": "1", "f": "1"}
    assert store.events == ["MODIFIED b", "ADDED e", "ADDED f", "DELETED a", "DELETED c"]
    assert refl.resource_version == "7" and refl.synced.is_set()


async def test_each_page_is_handed_over_before_the_next_arrives() -> None:
    kube, store = FakeKube(), Store()
    refl = _reflector(kube, store)
    served_at_event: list[int] = []
    kube.lists.append([[_node("a", "1")], [_node("b", "1")], [_node("c", "1")]])

    def handler(kind: str, obj: JSON) -> None:
        served_at_event.append(kube.pages_served)
        store(kind, obj)

    refl.handler = handler
    await _listed(refl)
    assert served_at_event == [1, 2, 3]  # not [3, 3, 3]: no page waited for the whole list


async def test_a_big_page_lets_other_tasks_run_while_it_is_handed_over() -> None:
    """The scheduler's /filter runs on the same event loop: one page must not hold it."""
    kube, store = FakeKube(), Store()
    refl = _reflector(kube, store)
    size = 3 * HAND_OVER_BATCH
    kube.lists.append([[_node(f"n{i}", "1") for i in range(size)]])
    ticks = [0]
    ticks_at_event: list[int] = []

    async def ticker() -> None:
        while True:
            ticks[0] += 1
            await asyncio.sleep(0)

    def handler(kind: str, obj: JSON) -> None:
        ticks_at_event.append(ticks[0])
        store(kind, obj)

    refl.handler = handler
    other = asyncio.create_task(ticker())
    try:
        await _listed(refl)
    finally:
        other.cancel()
    assert len(store.objects) == size
    batches = [ticks_at_event[i] for i in range(0, size, HAND_OVER_BATCH)]
    assert batches[0] < batches[1] < batches[2]  # the other task ran between batches


async def test_the_initial_pages_are_dropped_before_the_hook_and_only_they_call_it() -> None:
    kube, store = FakeKube(), Store()
    alive: list[bool] = []
    refl = _reflector(
        kube, store, after_initial_page=lambda: alive.append(kube.served[-1]() is not None)
    )
    kube.lists.append([[_node("a", "1")], [_node("b", "1")]])
    await _listed(refl)
    assert alive == [False, False]  # called after each page, the page already freed
    kube.lists.append([[_node("a", "2")], [_node("b", "2")]])
    await _listed(refl)
    assert alive == [False, False]  # a relist is not the initial list: no call


async def test_an_error_mid_list_deletes_nothing_until_a_complete_list() -> None:
    kube, store = FakeKube(), Store()
    refl = _reflector(kube, store)
    kube.lists.append([[_node("a", "1"), _node("b", "1")], [_node("c", "1")]])
    await _listed(refl)
    # The relist fails after its first page: a is gone and b changed on the server.
    kube.lists.append([[_node("b", "2")], KubeError(500, "InternalError", "etcd", "/api/v1/nodes")])
    store.events.clear()
    with pytest.raises(KubeError):
        await _listed(refl)
    assert store.events == ["MODIFIED b"]  # the newer b, nothing deleted
    assert store.objects == {"a": "1", "b": "2", "c": "1"}
    assert refl.resource_version == "7"  # still the last complete list's
    kube.lists.append([[_node("b", "2")], [_node("c", "1")]])
    await _listed(refl)
    assert store.objects == {"b": "2", "c": "1"}
    assert store.events == ["MODIFIED b", "DELETED a"]  # b not repeated


async def test_the_after_list_hook_follows_every_complete_list_and_no_failed_one() -> None:
    """The scheduler forgets its node locks' history there: a relist folds the changes
    since the watch's last event into one."""
    kube, store = FakeKube(), Store()
    lists: list[dict[str, str]] = []
    refl = _reflector(kube, store, after_list=lambda: lists.append(dict(store.objects)))
    kube.lists.append([[_node("a", "1")], [_node("b", "1")]])
    await _listed(refl)
    assert lists == [{"a": "1", "b": "1"}]  # after the whole list was handed over
    kube.lists.append([[_node("a", "2")], KubeError(500, "boom", "failed", "/api/v1/nodes")])
    with pytest.raises(KubeError):
        await _listed(refl)
    assert len(lists) == 1
    kube.lists.append([[_node("a", "3")]])
    await _listed(refl)
    assert lists[-1] == {"a": "3"}


async def test_an_expired_continue_restarts_the_list_from_scratch() -> None:
    """run() lists again after a 410 on ``continue``; the restarted list's ``seen`` is
    fresh, so an object only the broken list had seen is still deleted."""
    kube, store = FakeKube(), Store()
    refl = _reflector(kube, store)
    kube.lists.append([[_node("a", "1"), _node("b", "1")], [_node("c", "1")]])
    await _listed(refl)
    store.events.clear()
    refl.synced.clear()
    gone = Gone(410, "Expired", "continue token too old", "/api/v1/nodes")
    kube.lists.append([[_node("a", "1"), _node("d", "1")], gone])  # a seen, then 410
    kube.lists.append([[_node("b", "1")], [_node("d", "1")]])  # a deleted meanwhile
    task = asyncio.create_task(refl.run())
    try:
        await asyncio.wait_for(kube.watching.wait(), 10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert not kube.lists  # both lists were read
    assert store.objects == {"b": "1", "d": "1"}
    assert store.events == ["ADDED d", "DELETED a", "DELETED c"]


# --- against the real kube-apiserver ---------------------------------------------


def _pod(name: str, namespace: str, labels: dict[str, str] | None = None) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.mark.controlplane
async def test_a_paged_relist_on_the_api_server_gives_exactly_its_pods(
    kube: Kube, namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for name in ("a", "b", "c", "d"):
        await kube.request("POST", pods, body=_pod(name, namespace))
    store = Store()
    refl = Reflector(kube, pods, store, name="paged", page_size=2)
    task = asyncio.create_task(refl.run())
    await asyncio.wait_for(refl.synced.wait(), 20)
    await _stop(task)
    # While the reflector is away: two deleted, one changed, two created.
    for name in ("a", "c"):
        await kube.request("DELETE", f"{pods}/{name}", query=[("gracePeriodSeconds", 0)])
    await kube.patch_pod_annotations(namespace, "b", {"k": "v"})
    for name in ("e", "f"):
        await kube.request("POST", pods, body=_pod(name, namespace))
    store.events.clear()
    task = asyncio.create_task(refl.run())
    try:
        server: dict[str, str] = {}

        async def matches() -> bool:
            items, _ = await kube.list_all(pods)
            server.clear()
            server.update({object_key(p): p["metadata"]["resourceVersion"] for p in items})
            return store.objects == server

        for _ in range(100):
            if await matches():
                break
            await asyncio.sleep(0.1)
        assert store.objects == server and len(server) == 4
        changes = ["MODIFIED b", "ADDED e", "ADDED f", "DELETED a", "DELETED c"]
        assert sorted(store.events) == sorted(c.replace(" ", f" {namespace}/") for c in changes)
    finally:
        await _stop(task)


@pytest.mark.controlplane
async def test_a_410_on_continue_from_the_api_server_restarts_the_list(
    kube: Kube, namespace: str
) -> None:
    """The second page's request is answered 410 once (as kube-apiserver does for a
    compacted continue token); the reflector lists again from the first page."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for name in ("a", "b", "c"):
        await kube.request("POST", pods, body=_pod(name, namespace))
    store = Store()
    refl = Reflector(kube, pods, store, name="expired", page_size=1, max_backoff=0.01)
    real_request = kube.request
    requests: list[str] = []
    expired = [False]

    async def expiring(method: str, path: str, **kwargs: Any) -> JSON:
        query = dict(kwargs.get("query", ()))
        if path == pods and "watch" not in query:
            token = query.get("continue")
            requests.append("continue" if token else "first")
            if token and not expired[0]:
                expired[0] = True
                raise Gone(410, "Expired", "The provided continue parameter is too old", path)
        return await real_request(method, path, **kwargs)

    kube.request = expiring  # type: ignore[method-assign]
    task = asyncio.create_task(refl.run())
    try:
        await asyncio.wait_for(refl.synced.wait(), 20)
        assert requests[:3] == ["first", "continue", "first"]  # restarted from scratch
        assert set(store.objects) == {f"{namespace}/{n}" for n in "abc"}
        assert [e.split()[0] for e in store.events] == ["ADDED"] * 3  # a not repeated
    finally:
        await _stop(task)
