"""``hami run --role node`` as a process: the usage monitor runs from the config file, names
a container by its pod through the real API server and removes a gone pod's directory."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from _monitor_helpers import Proc, RegionSpec, write_region
from _node_helpers import spawn_node_agent, write_fake_node_config
from prometheus_client.parser import text_string_to_metric_families

from hami.kube.client import Kube
from hami.testkit import ControlPlane
from hami.testkit.cluster import poll


@pytest.fixture
def work_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hmp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def series(port: int, name: str) -> list[dict[str, str]]:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as answer,
        ):
            text = await answer.text()
    except aiohttp.ClientError:
        return []  # not serving yet
    return [
        dict(s.labels)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


async def test_node_process_exports_usage_and_removes_gone_dirs(
    controlplane: ControlPlane, kubelet_factory: Any, kube: Kube, namespace: str, work_dir: Path
) -> None:
    node = f"n-mon-{uuid.uuid4().hex[:6]}"
    kubelet = await kubelet_factory(node)
    path = write_fake_node_config(node, kubelet.plugin_dir, work_dir, level="info")
    port = free_port()
    cfg = yaml.safe_load(path.read_text())
    cfg["node"]["http"]["port"] = port
    cfg["node"]["monitor"] = {"scan_period": "200ms", "cleanup_grace": "1s"}
    path.write_text(yaml.safe_dump(cfg))
    containers = work_dir / "containers"
    pod = await kube.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": "user", "namespace": namespace},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    uid = pod["metadata"]["uid"]
    write_region(
        containers,
        uid,
        "main",
        RegionSpec(uuids=(f"GPU-{node}-0",), procs=(Proc(memory={0: (0, 0, 0, 0, 123)}),)),
    )
    gone = containers / f"{uuid.uuid4()}_main"
    write_region(containers, gone.name.split("_")[0], "main", RegionSpec())
    then = time.time() - 3600
    os.utime(gone, (then, then))

    proc = await spawn_node_agent(path, controlplane.kubeconfig, node)
    try:

        async def exported() -> bool:
            return bool(await series(port, "hami_vgpu_memory_used_bytes"))

        await poll(exported, 30, "hami_vgpu_memory_used_bytes on the process's /metrics")
        (labels,) = await series(port, "hami_vgpu_memory_used_bytes")
        assert labels == {
            "namespace": namespace,
            "pod": "user",
            "container": "main",
            "vdevice_index": "0",
            "device_uuid": f"GPU-{node}-0",
            "zone": "vGPU",
        }
        await poll(lambda: not gone.exists(), 20, "the gone pod's directory removed")
        assert (containers / f"{uid}_main" / "a1.cache").exists()
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        assert proc.stdout is not None
        output = (await proc.stdout.read()).decode()
    assert "monitor.removed_gone_pod_dir" in output
