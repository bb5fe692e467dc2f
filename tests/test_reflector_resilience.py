"""Item 1 of issue 9: a handler that raises on one object must not end the watch, and the
reflector says when its stream is broken (so the scheduler stops claiming readiness)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from structlog.testing import capture_logs

from hami.kube.client import Kube, Page
from hami.kube.raw import KubeError, Unreachable
from hami.kube.reflector import Reflector
from hami.testkit.cluster import poll


def _node(name: str, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


def test_handler_error_is_logged_with_the_object_and_later_objects_arrive() -> None:
    seen: list[str] = []

    def handler(kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name == "bad":
            raise ValueError("unparsable annotation")
        seen.append(f"{kind} {name}")

    refl = Reflector(None, "/api/v1/nodes", handler, name="nodes")  # type: ignore[arg-type]
    with capture_logs() as logs:
        refl._deliver("ADDED", _node("bad"))
        refl._deliver("ADDED", _node("good"))
        refl._deliver("MODIFIED", _node("bad", "2"))
        refl._deliver("MODIFIED", _node("good", "2"))
    assert seen == ["ADDED good", "MODIFIED good"]
    failures = [e for e in logs if e["event"].startswith("handler failed")]
    assert [(e["object"], e["kind"]) for e in failures] == [("bad", "ADDED"), ("bad", "MODIFIED")]
    assert all(e["log_level"] == "error" and e["exc_info"] for e in failures)


async def test_watch_survives_a_handler_error_on_the_real_api_server(kube: Kube) -> None:
    label = f"refl-{uuid.uuid4().hex[:8]}"
    bad, good = f"{label}-bad", f"{label}-good"
    seen: set[str] = set()

    def handler(kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name == bad:
            raise RuntimeError("handler bug")
        seen.add(name)

    refl = Reflector(kube, "/api/v1/nodes", handler, name="nodes", label_selector=f"test={label}")
    task = asyncio.create_task(refl.run())
    try:
        await asyncio.wait_for(refl.synced.wait(), 20)
        for name in (bad, good):  # the bad one first: the good one comes on the same watch
            body = {"metadata": {"name": name, "labels": {"test": label}}}
            await kube.request("POST", "/api/v1/nodes", body=body)
        await poll(lambda: good in seen or task.done(), 20, "the node after the bad one")
        assert not task.done(), task.exception()
        assert good in seen
        assert refl.streaming
    finally:
        task.cancel()
        for name in (bad, good):
            with contextlib.suppress(KubeError):
                await kube.request("DELETE", f"/api/v1/nodes/{name}")


async def test_down_for_tracks_a_broken_stream() -> None:
    now = [100.0]
    fail = [True]
    opened = asyncio.Event()

    class FakeKube:
        """Lists work; the watch is refused until ``fail`` clears, then stays open."""

        async def list_pages(self, *args: Any, **kwargs: Any) -> AsyncIterator[Page]:
            yield Page([], "1", True)

        @contextlib.asynccontextmanager
        async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[AsyncIterator[Any]]:
            if fail[0]:
                raise Unreachable("connection refused", "/api/v1/nodes", sent=False)

            async def quiet() -> AsyncIterator[Any]:
                opened.set()
                await asyncio.Event().wait()  # an open watch with nothing to say
                yield {}

            yield quiet()

    refl = Reflector(
        FakeKube(),  # type: ignore[arg-type]
        "/api/v1/nodes",
        lambda kind, obj: None,
        name="nodes",
        max_backoff=0.01,
        clock=lambda: now[0],
    )
    assert refl.down_for() == 0.0 and not refl.streaming  # not listed yet
    task = asyncio.create_task(refl.run())
    try:
        await poll(lambda: refl.synced.is_set() and refl._broken_since is not None, 10, "break")
        assert not refl.streaming
        now[0] += 7.5  # the list keeps working, the watch does not: still broken
        await poll(lambda: refl.down_for() == 7.5, 10, "down_for")
        fail[0] = False
        await asyncio.wait_for(opened.wait(), 10)
        assert refl.streaming and refl.down_for() == 0.0
    finally:
        task.cancel()
