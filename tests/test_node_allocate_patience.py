"""kubelet's Allocate waits out a short API server outage (issue 9 item 4): a pod whose
Allocate fails is Failed for good, so the node agent hands its Allocator the client under
the patient retry policy (PATIENT_RETRY) instead of failing the pod at the first refusal.

Exercised through real HTTP: a small API server on loopback answers 503 on cue, and the
agent's own ``Kube`` (with an injected clock, so no test waits for real) talks to it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from _node_helpers import NODE, TO_ALLOC, fake_backend, short_tmp_dir
from _node_helpers import pod as node_pod
from aiohttp import web
from kubernetes_asyncio import client

from hami.config import Config, Duration
from hami.kube.client import Kube
from hami.kube.raw import PATIENT_RETRY
from hami.node import NodeAgent
from hami.node.allocate import AllocateError
from hami.protocol import keys


class FlakyApiServer:
    """One Node and one pod waiting for its Allocate; ``failing`` requests in a row are
    answered 503 (``failing < 0``: every one). ``log`` holds (fake time, method, path)."""

    def __init__(self, now: list[float]) -> None:
        self.now = now
        self.failing = 0
        self.node: dict[str, Any] = {"metadata": {"name": NODE, "annotations": {}}}
        self.pod = node_pod("p", "GPU-u-0,NVIDIA,1000,0:;")
        self.log: list[tuple[float, str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.log.append((self.now[0], request.method, request.path))
        if self.failing:
            self.failing -= 1 if self.failing > 0 else 0
            return web.json_response({"message": "etcd is restarting"}, status=503)
        obj = self.node if request.path.startswith("/api/v1/nodes/") else self.pod
        if request.path == "/api/v1/pods":
            return web.json_response({"metadata": {"resourceVersion": "1"}, "items": [self.pod]})
        if request.method == "PATCH":
            changes = (await request.json())["metadata"]["annotations"]
            annotations = obj["metadata"].setdefault("annotations", {})
            for key, value in changes.items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
        return web.json_response(obj)


@contextlib.asynccontextmanager
async def flaky_cluster(
    tmp_path: Path, cfg: Config | None = None
) -> AsyncIterator[tuple[FlakyApiServer, NodeAgent, list[float]]]:
    """The fake API server and a ready node agent talking to it through a ``Kube`` whose
    back-off sleeps advance a fake clock."""
    now = [0.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    server = FlakyApiServer(now)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    configuration = client.Configuration(host=f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        async with client.ApiClient(configuration) as api:
            with short_tmp_dir() as plugins:
                agent = NodeAgent(
                    cfg or Config(),
                    node_name=NODE,
                    kube=Kube(api, sleep=sleep, clock=lambda: now[0]),
                    backends={"fake": fake_backend(tmp_path)},
                    register_period=3600,  # one registration at start, then quiet
                    device_plugin_dir=str(plugins),
                    serve_http=False,
                    kubelet_poll=0.05,
                    # this server answers no watches: Allocate reads it, as it does whenever
                    # the agent's watches are not current (tests/test_node_informer.py)
                    watch_pods=False,
                )
                task = asyncio.create_task(agent.run())
                try:
                    await agent.wait_ready(10)
                    async with asyncio.timeout(10):
                        while not server.node["metadata"]["annotations"]:  # noqa: ASYNC110
                            await asyncio.sleep(0.02)  # the registration landed
                    yield server, agent, now
                finally:
                    await agent.stop()
                    await task
    finally:
        await runner.cleanup()


async def allocate(agent: NodeAgent, tmp_path: Path) -> Any:
    assert agent.allocator is not None
    backend = fake_backend(tmp_path)
    return await agent.allocator.allocate(backend, [1], await backend.enumerate())


async def test_allocate_waits_out_a_short_outage(tmp_path: Path) -> None:
    async with flaky_cluster(tmp_path) as (server, agent, now):
        server.failing = 8  # more than the default policy's 4 retries would wait out
        plan = await allocate(agent, tmp_path)
    assert plan.done
    assert server.pod["metadata"]["annotations"][keys.BIND_PHASE] == "success"
    assert server.pod["metadata"]["annotations"][TO_ALLOC] == ";"
    assert 0 < now[0] <= 8 * PATIENT_RETRY.cap  # capped back-off, in fake time only


async def test_allocate_fails_once_the_outage_outlasts_the_budget(tmp_path: Path) -> None:
    async with flaky_cluster(tmp_path) as (server, agent, _now):
        server.log.clear()
        server.failing = -1
        with pytest.raises(AllocateError, match="cannot read the node or its pods"):
            await allocate(agent, tmp_path)
    # the node read was retried for the policy's whole budget, not longer (no pod was found,
    # so none was failed)
    assert {(method, path) for _t, method, path in server.log} == {("GET", f"/api/v1/nodes/{NODE}")}
    assert PATIENT_RETRY.budget is not None
    spent = server.log[-1][0] - server.log[0][0]
    assert PATIENT_RETRY.budget - PATIENT_RETRY.cap <= spent <= PATIENT_RETRY.budget


async def test_the_allocator_judges_stalled_locks_by_the_configured_timeout(
    tmp_path: Path,
) -> None:
    """The node reads the scheduler's config file: ``scheduler.allocation_timeout`` is the
    one staleness rule's bound on both sides."""
    base = Config()
    cfg = dataclasses.replace(
        base, scheduler=dataclasses.replace(base.scheduler, allocation_timeout=Duration(17))
    )
    async with flaky_cluster(tmp_path, cfg) as (_server, agent, _now):
        assert agent.allocator is not None
        assert agent.allocator.rules.allocation_timeout == timedelta(seconds=17)
