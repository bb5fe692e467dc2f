"""Allocate from the node agent's watches (issue 11, item 7), against the real API server.

Round trips are counted by a ``Kube`` whose every request is recorded; the watches run on
another, uncounted client, as in the agent (they are not per-Allocate work)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_node_controlplane import host_dir, make_backend  # noqa: F401  (host_dir: fixture)

from hami.backends.fake import FakeBackend
from hami.config import Config
from hami.kube.client import Kube, Query, Timeout, node_path, open_client, pods_path
from hami.kube.raw import JSON, RetryPolicy, Unreachable
from hami.node import NodeAgent
from hami.node.allocate import Allocator
from hami.node.podcache import NodeCache
from hami.protocol import ContainerDevice, NodeLock, encode_pod_devices, keys
from hami.testkit import ControlPlane
from hami.testkit.cluster import poll

TO_ALLOC = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"


class CountingKube(Kube):
    """Records each request as ``METHOD kind`` (kind: node, pod, pods)."""

    def __init__(self, api: Any, retry: RetryPolicy, calls: Counter[str]) -> None:
        super().__init__(api, retry)
        self.calls = calls

    def with_retry(self, policy: RetryPolicy) -> CountingKube:
        return CountingKube(self.api, policy, self.calls)

    async def request(self, method: str, path: str, **kwargs: Any) -> JSON:
        kind = "node" if path.startswith("/api/v1/nodes/") else "pod"
        if path.endswith("/pods"):
            kind = "pods"
        self.calls[f"{method} {kind}"] += 1
        return await super().request(method, path, **kwargs)


class BrokenWatchKube(Kube):
    """Lists work; every watch fails as a dropped connection would."""

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, query: Query = (), request_timeout: Timeout = None
    ) -> AsyncIterator[AsyncIterator[JSON]]:
        raise aiohttp.ClientConnectionError("watch refused (test)")
        yield  # pragma: no cover


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


#: Nodes this module made: cluster-scoped, so they would outlive the test on the shared
#: control plane (and show up in every later test that lists nodes)
_MADE: set[str] = set()


async def make_node(kube: Kube, name: str) -> None:
    _MADE.add(name)
    await kube.create("/api/v1/nodes", {"metadata": {"name": name}})


@pytest.fixture(autouse=True)
async def nodes_removed(kube: Kube) -> AsyncIterator[None]:
    """Every test here uses the control plane; set up first, so torn down last."""
    yield
    while _MADE:
        with contextlib.suppress(Exception):  # best effort: gone already is fine
            await kube.delete(node_path(_MADE.pop()))


def bound_pod(name: str, node: str, entries: list[list[ContainerDevice]]) -> JSON:
    """A pod as the HAMi scheduler leaves it after bind: on the node, allocating."""
    value = encode_pod_devices(entries)
    return {
        "metadata": {
            "name": name,
            "annotations": {
                keys.VGPU_NODE: node,
                ALLOCATED: value,
                TO_ALLOC: value,
                keys.BIND_PHASE: "allocating",
                keys.BIND_TIME: str(int(datetime.now(UTC).timestamp())),
            },
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": str(len(devices))}},
                }
                for i, devices in enumerate(entries)
            ],
        },
    }


async def bind(kube: Kube, namespace: str, node: str, entries: list[list[ContainerDevice]]) -> str:
    """The scheduler's part: lock the node for a new pod, then the pod, bound. Its name."""
    name = unique("p")
    lock = NodeLock(datetime.now(UTC), namespace, name).encode()
    await kube.patch_node_annotations(node, {keys.NODE_LOCK: lock})
    await kube.create(pods_path(namespace), bound_pod(name, node, entries))
    return name


async def read_annotations(kube: Kube, path: str) -> dict[str, str]:
    obj = await kube.request("GET", path)
    found: dict[str, str] = obj["metadata"].get("annotations") or {}
    return found


class Rig:
    """A node, its watches (``cache``, uncounted) and an Allocator on a counting client."""

    def __init__(self, kube: Kube, cache_kube: Kube, node: str, backend: FakeBackend) -> None:
        self.kube = kube
        self.node = node
        self.backend = backend
        self.calls: Counter[str] = Counter()
        counted = CountingKube(kube.api, kube.retry, self.calls)
        self.cache = NodeCache(cache_kube, node, writer=counted, max_backoff=0.2)
        self.allocator = Allocator(node, counted, cache=self.cache)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.cache.run(), name="test-node-cache")
        for reflector in self.cache.reflectors:
            async with asyncio.timeout(30):
                await reflector.synced.wait()

    async def freeze(self) -> None:
        """Stop the watches without marking them broken: a watch that is merely late."""
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def seen(self, namespace: str, name: str) -> None:
        """Wait until the watches show the pod and the lock naming it."""

        async def check() -> bool:
            node = self.cache.node_object or {}
            lock = (node.get("metadata", {}).get("annotations") or {}).get(keys.NODE_LOCK, "")
            return self.cache.pod(namespace, name) is not None and lock.endswith(f",{name}")

        await poll(check, 30, f"the watches to show pod {name} and its lock", interval=0.02)

    async def allocate(self, count: int = 1) -> Any:
        """One Allocate, and the lock release it may have left in flight."""
        plan = await self.allocator.allocate(self.backend, [count], await self.backend.enumerate())
        await self.allocator.settle()
        return plan


@pytest.fixture
async def rig(
    controlplane: ControlPlane,
    kube: Kube,
    host_dir: Path,  # noqa: F811
) -> AsyncIterator[Rig]:
    node = unique("inf")
    await make_node(kube, node)
    async with open_client(controlplane.kubeconfig) as cache_kube:
        rig = Rig(kube, cache_kube, node, make_backend(node, host_dir))
        await rig.start()
        try:
            yield rig
        finally:
            if rig.task is not None:
                await rig.freeze()


def gpus(node: str, *indexes: int) -> list[list[ContainerDevice]]:
    return [[ContainerDevice(f"GPU-{node}-{i}", "NVIDIA", 1000, 10)] for i in indexes]


async def test_one_container_allocate_takes_two_round_trips(rig: Rig, namespace: str) -> None:
    name = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 1))
    await rig.seen(namespace, name)

    wanted = await rig.allocator.preferred(rig.backend)
    assert wanted == [f"GPU-{rig.node}-1"]
    assert sum(rig.calls.values()) == 0, rig.calls  # GetPreferredAllocation: no round trip

    plan = await rig.allocate()

    assert plan.done and [d.uuid for d in plan.containers[0].devices] == [f"GPU-{rig.node}-1"]
    assert rig.calls == Counter({"PATCH pod": 1, "PATCH node": 1}), rig.calls
    assert rig.allocator.served == {"cache": 2, "api": 0}
    pod = await read_annotations(rig.kube, f"{pods_path(namespace)}/{name}")
    assert pod[TO_ALLOC] == ";" and pod[keys.BIND_PHASE] == "success"
    assert keys.NODE_LOCK not in await read_annotations(rig.kube, node_path(rig.node))


async def test_next_container_plans_from_the_last_write_not_a_late_watch(
    rig: Rig, namespace: str
) -> None:
    name = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 0, 1))
    await rig.seen(namespace, name)

    first = await rig.allocate()  # the watch has not delivered this write yet
    second = await rig.allocate()

    assert [c.index for c in first.containers] == [0] and not first.done
    assert [c.index for c in second.containers] == [1] and second.done
    assert rig.calls == Counter({"PATCH pod": 2, "PATCH node": 1}), rig.calls
    assert rig.allocator.served == {"cache": 2, "api": 0}
    pod = await read_annotations(rig.kube, f"{pods_path(namespace)}/{name}")
    assert pod[TO_ALLOC] == ";;" and pod[keys.BIND_PHASE] == "success"


async def test_a_watch_that_has_not_seen_the_pod_falls_back_to_the_api(
    rig: Rig, namespace: str
) -> None:
    await rig.freeze()  # synced and not broken, but it will not see what follows
    assert rig.cache.not_current() is None
    name = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 1))

    plan = await rig.allocate()

    assert plan.done and [d.uuid for d in plan.containers[0].devices] == [f"GPU-{rig.node}-1"]
    assert rig.allocator.served == {"cache": 0, "api": 1}
    pod = await read_annotations(rig.kube, f"{pods_path(namespace)}/{name}")
    assert pod[TO_ALLOC] == ";" and pod[keys.BIND_PHASE] == "success"
    assert keys.NODE_LOCK not in await read_annotations(rig.kube, node_path(rig.node))


async def test_a_decision_changed_since_the_watch_saw_it_is_not_served(
    rig: Rig, namespace: str
) -> None:
    name = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 0))
    await rig.seen(namespace, name)
    await rig.freeze()
    # the decision changes after the last event the watch delivered
    changed = encode_pod_devices(gpus(rig.node, 1))
    await rig.kube.patch_pod_annotations(namespace, name, {TO_ALLOC: changed, ALLOCATED: changed})

    plan = await rig.allocate()

    assert [d.uuid for d in plan.containers[0].devices] == [f"GPU-{rig.node}-1"]
    assert rig.allocator.served == {"cache": 0, "api": 1}
    # the guarded write from the old picture was refused (409), then the API read decided
    assert rig.calls["PATCH pod"] == 2 and rig.calls["GET node"] == 1, rig.calls
    pod = await read_annotations(rig.kube, f"{pods_path(namespace)}/{name}")
    assert pod[TO_ALLOC] == ";" and pod[keys.BIND_PHASE] == "success"
    assert pod[ALLOCATED] == changed


async def test_another_pending_pod_makes_allocate_read_the_api(rig: Rig, namespace: str) -> None:
    # a pod whose Allocate never came, then one bound with the lock: the watches alone
    # would be enough here, but two candidates is the case the API server must decide
    await rig.kube.create(
        pods_path(namespace), bound_pod(unique("old"), rig.node, gpus(rig.node, 0))
    )
    name = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 1))
    await rig.seen(namespace, name)

    plan = await rig.allocate()

    assert plan.pod == f"{namespace}/{name}"  # the lock's pod, as protocol.md section 4 says
    assert rig.allocator.served == {"cache": 0, "api": 1}


async def test_a_broken_watch_is_reported_and_allocate_reads_the_api(
    controlplane: ControlPlane,
    kube: Kube,
    namespace: str,
    host_dir: Path,  # noqa: F811
) -> None:
    node = unique("brk")
    await make_node(kube, node)
    broken = BrokenWatchKube(kube.api, kube.retry)
    rig = Rig(kube, broken, node, make_backend(node, host_dir))
    await rig.start()  # the lists succeed
    try:
        await poll(
            lambda: _async(rig.cache.down_for() > 0), 10, "the watch to be broken", interval=0.02
        )
        assert "broken" in (rig.cache.not_current() or "")
        assert rig.cache.status()["current"] is False
        name = await bind(kube, namespace, node, gpus(node, 1))

        plan = await rig.allocate()

        assert plan.pod == f"{namespace}/{name}" and plan.done
        assert rig.allocator.served == {"cache": 0, "api": 1}
    finally:
        await rig.freeze()


async def _async(value: bool) -> bool:
    return value


@pytest.fixture
def agent_host(host_dir: Path) -> Iterator[Path]:  # noqa: F811
    yield host_dir


async def test_the_agent_runs_the_watches_and_reports_them(
    controlplane: ControlPlane, kube: Kube, namespace: str, agent_host: Path
) -> None:
    node = unique("agt")
    await make_node(kube, node)
    backend = make_backend(node, agent_host)
    async with open_client(controlplane.kubeconfig) as client:
        agent = NodeAgent(
            Config(),
            node_name=node,
            kube=client,
            backends={"fake": backend},
            register_period=3600,
            device_plugin_dir=str(agent_host / "plugins"),
            serve_http=False,
            kubelet_poll=3600,
        )
        task = asyncio.create_task(agent.run())
        try:
            await agent.wait_ready(30)
            await poll(
                lambda: _async(agent.status().get("pod_cache", {}).get("current") is True),
                30,
                "the agent's watches to be current",
                interval=0.02,
            )
            name = await bind(kube, namespace, node, gpus(node, 0))
            cache, allocator = agent.cache, agent.allocator
            assert cache is not None and allocator is not None

            async def seen() -> bool:
                meta = (cache.node_object or {}).get("metadata", {})
                locked = keys.NODE_LOCK in (meta.get("annotations") or {})
                return locked and cache.pod(namespace, name) is not None

            await poll(seen, 30, "the agent's watches to show the pod and lock", interval=0.02)
            plan = await allocator.allocate(backend, [1], await backend.enumerate())
            assert plan.done
            assert agent.status()["allocate_reads"] == {"cache": 1, "api": 0}
        finally:
            await agent.stop()
            with contextlib.suppress(BaseException):
                await task


async def test_an_expired_lock_in_the_watch_makes_allocate_read_the_api(
    rig: Rig, namespace: str
) -> None:
    # a lock older than the lock timeout may have been taken over already: the watch's
    # copy cannot say which pod kubelet is starting
    name = unique("p")
    stale = NodeLock(datetime.now(UTC) - timedelta(minutes=10), namespace, name).encode()
    await rig.kube.patch_node_annotations(rig.node, {keys.NODE_LOCK: stale})
    await rig.kube.create(pods_path(namespace), bound_pod(name, rig.node, gpus(rig.node, 0)))
    await rig.seen(namespace, name)

    plan = await rig.allocate()

    assert plan.pod == f"{namespace}/{name}" and plan.done
    assert rig.allocator.served == {"cache": 0, "api": 1}


class LostAnswerKube(CountingKube):
    """The API server applies the next pod write but its answer never arrives (an outage
    that starts right after the write landed)."""

    lose = True

    async def patch_pod_annotations(self, *args: Any, **kwargs: Any) -> JSON:
        answer = await super().patch_pod_annotations(*args, **kwargs)
        if self.lose:
            self.lose = False
            raise Unreachable("ServerDisconnectedError()", "/api/v1/pods", sent=True)
        return answer


async def test_an_allocation_write_whose_answer_was_lost_is_not_failed(
    rig: Rig, namespace: str
) -> None:
    """Seen in the API server outage fault test: the allocation's pod write landed, its
    answer was lost; the agent fell back to the API, found no work left for the pod and
    failed it (UnexpectedAdmissionError). The pod, read again, shows the write landed."""
    losing = LostAnswerKube(rig.kube.api, rig.kube.retry, rig.calls)
    rig.allocator.kube = losing
    name = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 1))
    await rig.seen(namespace, name)

    plan = await rig.allocate()

    assert not losing.lose, "the write was not attempted through the cache path"
    assert plan.done and [d.uuid for d in plan.containers[0].devices] == [f"GPU-{rig.node}-1"]
    pod = await read_annotations(rig.kube, f"{pods_path(namespace)}/{name}")
    assert pod[TO_ALLOC] == ";" and pod[keys.BIND_PHASE] == "success"
    assert keys.NODE_LOCK not in await read_annotations(rig.kube, node_path(rig.node))


class ReleaseFirstKube(CountingKube):
    """Holds every pod write until a Node write has been sent: a release that waited for
    the pod write's answer would never come."""

    def __init__(self, api: Any, retry: RetryPolicy, calls: Counter[str]) -> None:
        super().__init__(api, retry, calls)
        self.node_written = asyncio.Event()

    async def request(self, method: str, path: str, **kwargs: Any) -> JSON:
        if method == "PATCH" and path.startswith("/api/v1/nodes/"):
            self.node_written.set()
        return await super().request(method, path, **kwargs)

    async def patch_pod_annotations(self, *args: Any, **kwargs: Any) -> JSON:
        async with asyncio.timeout(5):
            await self.node_written.wait()
        return await super().patch_pod_annotations(*args, **kwargs)


async def test_the_last_containers_lock_release_goes_out_with_its_pod_write(
    rig: Rig, namespace: str
) -> None:
    gate = ReleaseFirstKube(rig.kube.api, rig.kube.retry, rig.calls)
    rig.allocator.kube = gate
    rig.cache.writer = gate
    name = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 1))
    await rig.seen(namespace, name)

    plan = await rig.allocate()

    assert plan.done and rig.allocator.served == {"cache": 1, "api": 0}
    assert rig.calls == Counter({"PATCH pod": 1, "PATCH node": 1}), rig.calls
    pod = await read_annotations(rig.kube, f"{pods_path(namespace)}/{name}")
    assert pod[TO_ALLOC] == ";" and pod[keys.BIND_PHASE] == "success"
    assert keys.NODE_LOCK not in await read_annotations(rig.kube, node_path(rig.node))


async def test_a_failed_last_write_serves_the_released_locks_pod_not_the_next(
    rig: Rig, namespace: str
) -> None:
    """The release went out with the pod write and the write failed: meanwhile the node may
    be locked for the next pod, bound and waiting too. This call is the released lock's
    pod's (no other pod could be bound while its lock held), so that pod is read again and
    served; reading the Node's lock, as the API path does, would hand it the next pod's
    devices."""
    name = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 0))
    await rig.seen(namespace, name)
    await rig.freeze()
    changed = encode_pod_devices(gpus(rig.node, 1))  # the cached write will be refused
    await rig.kube.patch_pod_annotations(namespace, name, {TO_ALLOC: changed, ALLOCATED: changed})
    following = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 0))  # locks for it

    plan = await rig.allocate()

    assert plan.pod == f"{namespace}/{name}" and plan.done
    assert [d.uuid for d in plan.containers[0].devices] == [f"GPU-{rig.node}-1"]
    pod = await read_annotations(rig.kube, f"{pods_path(namespace)}/{name}")
    assert pod[TO_ALLOC] == ";" and pod[keys.BIND_PHASE] == "success"
    other = await read_annotations(rig.kube, f"{pods_path(namespace)}/{following}")
    assert other[TO_ALLOC] == encode_pod_devices(gpus(rig.node, 0))
    assert other[keys.BIND_PHASE] == "allocating"
    lock = (await read_annotations(rig.kube, node_path(rig.node)))[keys.NODE_LOCK]
    assert lock.endswith(f",{following}")  # the next pod's lock is left alone


async def test_a_failed_last_write_of_a_pod_that_no_longer_waits_reads_the_api(
    rig: Rig, namespace: str
) -> None:
    """After the early release, a lock pod that stopped waiting (marked failed by a lock
    takeover) cannot be the one kubelet starts: the API path decides, as before."""
    name = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 0))
    await rig.seen(namespace, name)
    await rig.freeze()
    await rig.kube.patch_pod_annotations(namespace, name, {keys.BIND_PHASE: "failed"})
    following = await bind(rig.kube, namespace, rig.node, gpus(rig.node, 1))

    plan = await rig.allocate()

    assert plan.pod == f"{namespace}/{following}" and plan.done
    assert [d.uuid for d in plan.containers[0].devices] == [f"GPU-{rig.node}-1"]
    stale = await read_annotations(rig.kube, f"{pods_path(namespace)}/{name}")
    assert stale[keys.BIND_PHASE] == "failed"
