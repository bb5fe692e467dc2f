"""Interop: node agents under the hami scheduler role and a real kube-scheduler.

Pods asking for `nvidia.com/gpu` go through kube-scheduler → hami extender (filter, bind
with the node lock) → kubelet emulator → the node agent's Allocate, and start Running with
the final annotations of protocol.md section 4."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hami import config, log
from hami.backends.base import BackendSettings
from hami.backends.fake import FakeBackend
from hami.kube.client import Kube
from hami.node import NodeAgent
from hami.protocol import keys
from hami.scheduler.role import SchedulerRole


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> None:
    """Another test's cli.main may have pointed logging at a capture stream closed since."""
    log.configure("info", "console", stream=sys.__stderr__)


RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")
DEVICES = [{"count": 2, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960}]


@pytest.fixture
def host_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hn-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def wait_phase(
    kube: Kube,
    namespace: str,
    name: str,
    timeout: float = 30.0,  # noqa: ASYNC109
) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            pod = await kube.get_pod(namespace, name)
            if (pod.get("status") or {}).get("phase") in ("Running", "Failed"):
                return pod
            await asyncio.sleep(0.1)


async def test_pods_placed_by_the_scheduler_start_on_node_agents(
    kubelet_factory: Any, kube_scheduler: Any, kube: Kube, namespace: str, host_dir: Path
) -> None:
    cfg = config.from_mapping(
        {
            "scheduler": {
                "http": {"address": "127.0.0.1", "port": 0},
                "extender": {"address": "127.0.0.1", "port": 0},
                "webhook": {"enabled": False},
                "handshake_period": "1s",
            },
            "backends": {
                "nvidia": {"enabled": False},
                "fake": {"enabled": True, "split_count": 4, "devices": DEVICES},
            },
        },
        env={},
    )
    suffix = uuid.uuid4().hex[:6]
    agents: list[tuple[NodeAgent, asyncio.Task[None]]] = []
    async with SchedulerRole(cfg, kube) as role:
        await role.wait_ready()
        await kube_scheduler(
            {
                "profiles": [{"schedulerName": cfg.scheduler.scheduler_name}],
                "extenders": [
                    {
                        "urlPrefix": role.url,
                        "filterVerb": "filter",
                        "bindVerb": "bind",
                        "nodeCacheCapable": True,
                        "weight": 1,
                        "managedResources": [
                            {"name": r, "ignoredByScheduler": True} for r in RESOURCES
                        ],
                    }
                ],
            }
        )
        try:
            nodes = [f"sched-{suffix}-{n}" for n in ("a", "b")]
            for node in nodes:
                kubelet = await kubelet_factory(node)
                backend = FakeBackend(
                    BackendSettings(
                        split_count=4,
                        options={
                            "devices": DEVICES,
                            "uuid_prefix": f"GPU-{node}",
                            "hamicore": {"containers_dir": str(host_dir / node)},
                        },
                    )
                )
                agent = NodeAgent(
                    cfg,
                    node_name=node,
                    kube=kube,
                    backends={"fake": backend},
                    register_period=1,
                    device_plugin_dir=str(kubelet.plugin_dir),
                    serve_http=False,
                    kubelet_poll=0.2,
                )
                agents.append((agent, asyncio.create_task(agent.run())))
                await agent.wait_ready()
                await kubelet.wait_for_resource("nvidia.com/gpu", healthy=8)
            names = [f"p{i}" for i in range(3)]
            for name in names:
                limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}
                body = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "schedulerName": cfg.scheduler.scheduler_name,
                        "containers": [
                            {"name": "c", "image": "busybox", "resources": {"limits": limits}}
                        ],
                    },
                }
                await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
            for name in names:
                pod = await wait_phase(kube, namespace, name)
                annotations = pod["metadata"]["annotations"]
                assert pod["status"]["phase"] == "Running", pod["status"].get("message")
                assert pod["spec"]["nodeName"] in nodes
                assert annotations[keys.BIND_PHASE] == "success"
                assert annotations["hami.io/vgpu-devices-to-allocate"] == ";"
                assert annotations["hami.io/vgpu-devices-allocated"].endswith(",NVIDIA,3000,0:;")
            for node in nodes:
                obj = await kube.get_node(node)
                assert keys.NODE_LOCK not in (obj["metadata"].get("annotations") or {})
        finally:
            for agent, task in agents:
                await agent.stop()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
