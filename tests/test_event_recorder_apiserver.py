"""The Event recorder against the real kube-apiserver: folding, rate limit, a dead server,
and the scheduler role's FilteringFailed storm."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _manifest_helpers import apply, documents
from _sched_helpers import FakeClock, create_pod, gpu_pod, running_scheduler, unique
from prometheus_client import CollectorRegistry

from hami.kube.client import ApiSession, Kube, open_client
from hami.kube.raw import JSON
from hami.kube.recorder import EventRecorder
from hami.testkit.cluster import LocalCluster, NodeSpec, limits, poll
from hami.testkit.cluster import gpu_pod as cluster_pod
from hami.testkit.controlplane import ControlPlane

pytestmark = pytest.mark.controlplane
SCHEDULER_SA = "system:serviceaccount:hami-system:hami-scheduler"


async def _events(kube: Kube, namespace: str, name: str) -> list[JSON]:
    items, _ = await kube.list_all(
        f"/api/v1/namespaces/{namespace}/events",
        query=[("fieldSelector", f"involvedObject.name={name}")],
    )
    return items


async def _pod(kube: Kube, namespace: str, name: str) -> JSON:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    return await kube.create(f"/api/v1/namespaces/{namespace}/pods", body)


@contextlib.asynccontextmanager
async def _sending(recorder: EventRecorder) -> AsyncIterator[EventRecorder]:
    task = asyncio.get_running_loop().create_task(recorder.run())
    try:
        yield recorder
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _settled(recorder: EventRecorder, kube: Kube, namespace: str) -> None:
    """Wait until the sender has written everything it may write now: a sentinel Event
    on another pod (its own rate limit, recorded last) is written after the rest."""
    sentinel = await _pod(kube, namespace, unique("sentinel"))
    recorder.record(sentinel, "Sentinel", "written after everything recorded before")

    async def written() -> bool:
        return bool(await _events(kube, namespace, sentinel["metadata"]["name"]))

    await poll(written, 20, "the sentinel Event")


async def test_identical_events_fold_into_one_object_with_their_count(
    kube: Kube, namespace: str
) -> None:
    pod = await _pod(kube, namespace, "p")
    recorder = EventRecorder(kube, registry=CollectorRegistry())
    async with _sending(recorder):
        for _ in range(50):
            recorder.record(pod, "FilteringFailed", "0/3 nodes are available", "Warning")
        await _settled(recorder, kube, namespace)
        events = await _events(kube, namespace, "p")
        assert len(events) == 1
        await recorder.flush()
    (event,) = await _events(kube, namespace, "p")
    assert event["count"] == 50
    assert event["reason"] == "FilteringFailed" and event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert event["lastTimestamp"] >= event["firstTimestamp"]


async def test_repeats_after_the_first_write_patch_the_same_object(
    kube: Kube, namespace: str
) -> None:
    pod = await _pod(kube, namespace, "p")
    recorder = EventRecorder(kube, registry=CollectorRegistry(), update_every=0.0)
    async with _sending(recorder):
        recorder.record(pod, "FilteringFailed", "no fit", "Warning")
        await _settled(recorder, kube, namespace)
        (first,) = await _events(kube, namespace, "p")
        assert first["count"] == 1
        for _ in range(3):
            recorder.record(pod, "FilteringFailed", "no fit", "Warning")

        async def patched() -> bool:
            events = await _events(kube, namespace, "p")
            return len(events) == 1 and events[0]["count"] == 4

        await poll(patched, 20, "the Event's count patched to 4")
    (event,) = await _events(kube, namespace, "p")
    assert event["metadata"]["name"] == first["metadata"]["name"]


async def test_different_messages_are_separate_events(kube: Kube, namespace: str) -> None:
    pod = await _pod(kube, namespace, "p")
    recorder = EventRecorder(kube, registry=CollectorRegistry())
    async with _sending(recorder):
        for i in range(30):
            recorder.record(pod, "FilteringFailed", f"message {i % 3}", "Warning")
        await recorder.flush()
    events = await _events(kube, namespace, "p")
    assert sorted((e["message"], e["count"]) for e in events) == [
        ("message 0", 10),
        ("message 1", 10),
        ("message 2", 10),
    ]


async def test_rate_limit_holds_per_pod(kube: Kube, namespace: str) -> None:
    pod = await _pod(kube, namespace, "p")
    recorder = EventRecorder(kube, registry=CollectorRegistry(), burst=5, refill=3600)
    async with _sending(recorder):
        for i in range(20):
            recorder.record(pod, "FilteringFailed", f"message {i}", "Warning")
        await _settled(recorder, kube, namespace)
        events = await _events(kube, namespace, "p")
        assert sorted(e["message"] for e in events) == [f"message {i}" for i in range(5)]
        # The rest wait for tokens; a last flush (shutdown) still writes them.
        await recorder.flush()
    assert len(await _events(kube, namespace, "p")) == 20


async def test_a_hung_api_server_never_blocks_the_caller(kube: Kube) -> None:
    """The sender hangs on a server that accepts and never answers; record() stays O(1):
    the bounded queue fills and drops, counted in hami_events_dropped_total."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    configuration = copy.copy(kube.api.configuration)
    configuration.host = f"http://127.0.0.1:{port}"
    registry = CollectorRegistry()
    pod: dict[str, Any] = {"metadata": {"namespace": "x", "name": "p", "uid": "u"}}
    try:
        async with ApiSession(configuration) as api:
            recorder = EventRecorder(Kube(api), registry=registry, queue_size=100)
            async with _sending(recorder):
                recorder.record(pod, "FilteringFailed", "first", "Warning")
                # The sender takes the first one and hangs on its create.
                await poll(lambda: recorder.pending == 0, 10, "the sender took the first")
                for i in range(2000):
                    recorder.record(pod, "FilteringFailed", f"m{i}", "Warning")
                assert recorder.pending == 100
                assert recorder.dropped == 1900
                await recorder.flush(seconds=0.5)  # bounded: returns although nothing is sent
    finally:
        server.close()
    assert registry.get_sample_value("hami_events_dropped_total") == 1900


async def test_role_unschedulable_pod_retried_makes_at_most_a_few_events(
    kube: Kube, namespace: str
) -> None:
    """kube-scheduler calls filter on every retry: 50 retries of a pod nothing can take are
    one Event whose count says 50 (the role's sender task does the writing)."""
    async with running_scheduler(kube, FakeClock()) as role:
        pod = gpu_pod("waits")
        pod["metadata"]["namespace"] = namespace
        pod = await create_pod(kube, namespace, pod)
        for _ in range(50):
            answer = await role.scheduler.filter({"Pod": pod, "NodeNames": ["no-such-node"]})
            assert answer["NodeNames"] == []

        async def one_event() -> bool:
            return bool(await _events(kube, namespace, "waits"))

        await poll(one_event, 20, "the FilteringFailed Event")
        await role.scheduler.drain()
        events = await _events(kube, namespace, "waits")
        assert [e["reason"] for e in events] == ["FilteringFailed"]
        assert events[0]["count"] == 50


async def test_kube_scheduler_retrying_an_unschedulable_pod_makes_at_most_a_few_events(
    controlplane: ControlPlane,
) -> None:
    """Issue 11's target: kube-scheduler retries a pod nothing can take (back-off 1 s, and
    on every node change); hami's Events for it stay within the per-pod burst, and their
    counts add up to every FilteringFailed once flushed."""
    nodes = (NodeSpec("ev-gpu", ({"count": 1, "model": "NVIDIA-Tesla T4", "memory": 15360},)),)
    async with LocalCluster(nodes, plane=controlplane) as cluster:
        role = cluster.role
        assert role is not None
        registry = role.scheduler.metrics.registry

        def failed_filters() -> float:
            value = registry.get_sample_value("hami_filter_total", {"outcome": "unschedulable"})
            return value or 0.0

        began = asyncio.get_running_loop().time()
        await cluster.create_pod(cluster_pod("huge", [limits(1, mem=100_000)]))
        await poll(lambda: failed_filters() >= 20, 60, "20 filter retries of the pod")
        elapsed = asyncio.get_running_loop().time() - began
        ours = [
            e
            for e in await cluster.events("huge")
            if (e.get("source") or {}).get("component") == "hami-scheduler"
        ]
        # burst 5, then one more write a minute (hami.kube.eventfold)
        assert 1 <= len(ours) <= 5 + int(elapsed // 60), ours
        retries = failed_filters()
        await role.scheduler.drain()
        ours = [
            e
            for e in await cluster.events("huge")
            if (e.get("source") or {}).get("component") == "hami-scheduler"
        ]
        assert {e["reason"] for e in ours} == {"FilteringFailed"}
        assert sum(e["count"] for e in ours) >= retries
        print(
            f"\nunschedulable pod: {retries:.0f} filter calls in {elapsed:.1f}s -> "
            f"{len(ours)} Event object(s), counts {[e['count'] for e in ours]}"
        )


async def test_a_bug_in_the_sender_costs_events_never_the_sender(
    kube: Kube, namespace: str
) -> None:
    """The sender runs under the role's TaskGroup: if it died, the role would restart."""
    pod = await _pod(kube, namespace, "p")
    recorder = EventRecorder(kube, registry=CollectorRegistry())
    due = recorder.folder.due
    calls = 0

    def broken_once(now: float) -> list[Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        return due(now)

    recorder.folder.due = broken_once  # type: ignore[method-assign]
    async with _sending(recorder):
        recorder.record(pod, "FilteringFailed", "first", "Warning")
        await poll(lambda: calls >= 1, 10, "the broken step")
        recorder.record(pod, "FilteringFailed", "second", "Warning")
        await _settled(recorder, kube, namespace)
    messages = sorted(e["message"] for e in await _events(kube, namespace, "p"))
    assert messages == ["first", "second"]  # the first waited in the folder, not lost


async def test_the_scheduler_service_account_may_create_and_patch_its_events(
    kube: Kube, controlplane: ControlPlane, namespace: str
) -> None:
    """The manifests' RBAC, applied for real, lets the recorder's writes through as the
    scheduler role's service account (a patch that RBAC refused would leave every count at
    1 in a real cluster while this file's other tests, run as admin, pass). Today the
    patch verb comes from the ``system:kube-scheduler`` binding the pod's kube-scheduler
    needs too."""
    for doc in documents("00-*.yaml") + documents("10-*.yaml"):
        await apply(kube, doc)
    pod = await _pod(kube, namespace, "p")
    async with open_client(controlplane.kubeconfig) as scheduler_kube:
        scheduler_kube.api.set_default_header("Impersonate-User", SCHEDULER_SA)
        registry = CollectorRegistry()
        recorder = EventRecorder(scheduler_kube, registry=registry, update_every=0.0)
        async with _sending(recorder):
            recorder.record(pod, "FilteringFailed", "no fit", "Warning")

            def ok(verb: str) -> float:
                labels = {"verb": verb, "outcome": "ok"}
                return registry.get_sample_value("hami_events_writes_total", labels) or 0.0

            await poll(lambda: ok("create") == 1, 20, "the create")
            recorder.record(pod, "FilteringFailed", "no fit", "Warning")
            await poll(lambda: ok("patch") == 1, 20, "the patch")
    assert registry.get_sample_value(
        "hami_events_writes_total", {"verb": "patch", "outcome": "error"}
    ) in (None, 0.0)
    (event,) = await _events(kube, namespace, "p")
    assert event["count"] == 2
