"""A node agent process killed with SIGKILL: kubelet has 0 allocatable within seconds.

The scenario of issue 9 item 6 as it happens on a node: the agent dies without cleaning up
(its socket file stays), its connections close, and kubelet (here the emulator) marks the
plugin's devices unhealthy at once; a new agent process serves a fresh socket, registers
and gets them back.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from _node_helpers import spawn_node_agent, write_fake_node_config

from hami.kube.client import Kube
from hami.testkit import ControlPlane, KubeletEmulator

RESOURCE = "nvidia.com/gpu"


@pytest.fixture
def work_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def start_agent(
    controlplane: ControlPlane,
) -> AsyncIterator[Any]:
    """Start ``hami run --role node`` processes; each is killed after the test."""
    procs: list[asyncio.subprocess.Process] = []

    async def start(node: str, config: Path) -> asyncio.subprocess.Process:
        proc = await spawn_node_agent(
            config, controlplane.kubeconfig, node, output=asyncio.subprocess.DEVNULL
        )
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _allocatable(kube: Kube, node: str) -> tuple[str | None, str | None]:
    status = (await kube.get_node(node))["status"]
    return status["capacity"].get(RESOURCE), status["allocatable"].get(RESOURCE)


async def test_killed_agent_process_has_0_allocatable_at_once_and_a_new_one_restores_it(
    kube: Kube, kubelet_factory: Any, start_agent: Any, work_dir: Path
) -> None:
    node = f"n-kill-{uuid.uuid4().hex[:6]}"
    kubelet: KubeletEmulator = await kubelet_factory(node)
    config = write_fake_node_config(node, kubelet.plugin_dir, work_dir)
    proc = await start_agent(node, config)
    await kubelet.wait_for_resource(RESOURCE, healthy=2, timeout=30)
    assert await _allocatable(kube, node) == ("2", "2")

    loop = asyncio.get_running_loop()
    killed = loop.time()
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    await kubelet.wait_for(lambda: not kubelet.plugins[RESOURCE].connected, timeout=10)
    assert loop.time() - killed < 5
    assert await _allocatable(kube, node) == ("2", "0")
    assert (kubelet.plugin_dir / "hami-nvidia.sock").exists()  # nobody cleaned up

    await start_agent(node, config)
    await kubelet.wait_for_resource(RESOURCE, healthy=2, timeout=30)
    assert await _allocatable(kube, node) == ("2", "2")
    assert len(kubelet.registrations) == 2
