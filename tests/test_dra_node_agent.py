"""The node agent with a ``mode: dra`` backend, against the real API server: it publishes
the ResourceSlice and serves the DRA plugin sockets instead of the node annotations and
the device plugin; stopping it withdraws the slice and its sockets."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import uuid
from pathlib import Path

from grpclib.client import Channel

from hami._proto.pluginregistration.v1 import api_grpc as reg_grpc
from hami._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from hami.backends.base import BackendSettings
from hami.backends.fake import FakeBackend
from hami.config import from_mapping
from hami.dra.names import slice_name
from hami.dra.publisher import CLASSES_PATH, SLICES_PATH
from hami.kube.client import Kube
from hami.kube.raw import NotFound
from hami.node.agent import NodeAgent


async def test_agent_in_dra_mode_publishes_and_serves(kube: Kube) -> None:
    node = f"dra-{uuid.uuid4().hex[:6]}"
    root = Path(tempfile.mkdtemp(prefix="hdra-", dir="/tmp"))
    # the agent creates its cluster-scoped DeviceClass; remove it afterwards unless it was
    # already there, so no later test on the shared control plane inherits it
    class_path = f"{CLASSES_PATH}/nvidia.hami.io"
    try:
        await kube.request("GET", class_path)
        class_was_there = True
    except NotFound:
        class_was_there = False
    await kube.create("/api/v1/nodes", {"metadata": {"name": node}})
    cfg = from_mapping(
        {
            "node": {
                "monitor": {"enabled": False},
                "dra": {
                    "plugins_dir": str(root / "p"),
                    "registry_dir": str(root / "r"),
                    "cdi_dir": str(root / "cdi"),
                },
            },
            "backends": {"fake": {"enabled": True, "mode": "dra"}},
        }
    )
    options = {
        "uuid_prefix": f"GPU-{node}",
        "devices": [{"count": 2, "model": "NVIDIA A100", "memory": 40960}],
    }
    backend = FakeBackend(BackendSettings(options=options))
    agent = NodeAgent(
        cfg,
        node_name=node,
        kube=kube,
        backends={"fake": backend},
        register_period=0.5,
        device_plugin_dir=str(root / "dp"),
        serve_http=False,
        kubelet_poll=0.05,
        min_backoff=0.05,
    )
    task = asyncio.create_task(agent.run())
    path = f"{SLICES_PATH}/{slice_name(node, 'nvidia')}"
    try:
        await agent.wait_ready(10)
        server, publisher = agent.dra["fake"]
        async with asyncio.timeout(20):
            await publisher.published.wait()
        item = await kube.request("GET", path)
        assert item["spec"]["nodeName"] == node
        assert [d["attributes"]["uuid"]["string"] for d in item["spec"]["devices"]] == [
            f"GPU-{node}-0",
            f"GPU-{node}-1",
        ]
        channel = Channel(path=str(root / "r" / "nvidia.hami.io-reg.sock"))
        try:
            info = await reg_grpc.RegistrationStub(channel).GetInfo(
                reg_pb2.InfoRequest(), timeout=10
            )
        finally:
            channel.close()
        assert info.endpoint == str(root / "p" / "nvidia.hami.io" / "dra.sock")
        # not the extender mode: no device plugin socket, no register annotation
        assert not (root / "dp" / "hami-nvidia.sock").exists()
        annotations = (await kube.get_node(node))["metadata"].get("annotations") or {}
        assert not any(key.startswith("hami.io/node-nvidia") for key in annotations)
        assert server.dra_socket.exists()
        writes = agent.metrics.registry.get_sample_value(
            "hami_dra_slice_writes_total", {"driver": "nvidia.hami.io"}
        )
        assert writes == 1
        # a device the backend now reports unhealthy is tainted with its cause
        # (re-enumeration: the fake judges the Xid as the NVIDIA backend does)
        assert backend.inject_xid(f"GPU-{node}-1", 79)
        for _ in range(400):  # bounded: 20 s; the agent re-enumerates every 0.5 s
            taints = (await kube.request("GET", path))["spec"]["devices"][1].get("taints")
            if taints:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the unhealthy device was not tainted")
        assert [(t["key"], t["value"], t["effect"]) for t in taints] == [
            ("hami.io/unhealthy", "xid-79", "NoSchedule")
        ]

        def slice_writes() -> float:
            value = agent.metrics.registry.get_sample_value(
                "hami_dra_slice_writes_total", {"driver": "nvidia.hami.io"}
            )
            return value or 0.0

        # the write is counted once its answer is read, which can come after another client
        # already sees the new slice
        for _ in range(100):  # bounded: 5 s
            if slice_writes() >= 2:
                break
            await asyncio.sleep(0.05)
        assert slice_writes() == 2
    finally:
        await agent.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(NotFound):
            await kube.delete(f"/api/v1/nodes/{node}")
        if not class_was_there:
            with contextlib.suppress(NotFound):
                await kube.delete(class_path)
    try:
        await kube.request("GET", path)
        raise AssertionError("the slice outlived the agent")
    except NotFound:
        pass
    # its sockets are gone (kubelet's plugin watcher sees the plugin leave)
    assert not (root / "r" / "nvidia.hami.io-reg.sock").exists()
    assert not (root / "p" / "nvidia.hami.io" / "dra.sock").exists()
    shutil.rmtree(root, ignore_errors=True)
