"""Builders for scheduler tests against the real control plane."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from hami import config
from hami.kube.client import Kube
from hami.kube.raw import KubeError
from hami.scheduler.role import SchedulerRole
from hami.scheduler.service import Clock
from hami.testkit.cluster import limits as nvidia_limits

T0 = datetime(2024, 5, 20, 10, 0, 0, tzinfo=UTC)


class FakeClock:
    """Wall time set by the test; monotonic time is real (lock waits are bounded by it)."""

    def __init__(self, start: datetime = T0) -> None:
        self.value = start

    def now(self) -> datetime:
        return self.value

    def advance(self, seconds: float) -> None:
        self.value += timedelta(seconds=seconds)

    def clock(self) -> Clock:
        loop = asyncio.get_running_loop()
        return Clock(now=self.now, monotonic=loop.time)


def scheduler_config(**overrides: Any) -> config.Config:
    raw: dict[str, Any] = {
        "scheduler": {
            "http": {"address": "127.0.0.1", "port": 0},
            "extender": {"address": "127.0.0.1", "port": 0},
            "webhook": {"enabled": False},
            "bind_lock_wait": "20s",
            **overrides,
        },
        "backends": {"nvidia": {"enabled": True}},
    }
    return config.from_mapping(raw, env={})


@contextlib.asynccontextmanager
async def running_scheduler(
    kube: Kube, fake: FakeClock, cfg: config.Config | None = None, **kwargs: Any
) -> AsyncIterator[SchedulerRole]:
    role = SchedulerRole(
        cfg or scheduler_config(), kube, clock=fake.clock(), handshake_loop=False, **kwargs
    )
    async with role:
        await role.wait_ready()
        yield role


def register(uuids: list[str], *, memory: int = 10000, count: int = 5, cores: int = 100) -> str:
    return "".join(f"{u},{count},{memory},{cores},NVIDIA-A100-SXM4-40GB,0,true:" for u in uuids)


async def create_node(kube: Kube, name: str, annotations: dict[str, str]) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
    }
    await kube.request("POST", "/api/v1/nodes", body=body)


async def delete_nodes(kube: Kube, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(KubeError):
            await kube.request("DELETE", f"/api/v1/nodes/{name}")


def gpu_pod(
    name: str,
    *,
    count: int = 1,
    mem: int | None = 3000,
    cores: int | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = nvidia_limits(count, mem=mem, cores=cores)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


async def create_pod(kube: Kube, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    return await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)


async def post(url: str, body: Any) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        data: dict[str, Any] = await resp.json()
        return data


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def replace_scheduler(cfg: config.Config, **changes: Any) -> config.Config:
    return dataclasses.replace(cfg, scheduler=dataclasses.replace(cfg.scheduler, **changes))


def binding(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """kube-scheduler's ExtenderBindingArgs for ``pod`` (its own field spelling)."""
    meta = pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node,
    }
