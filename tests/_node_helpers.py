"""Builders for the node agent's tests without a cluster: a fake backend, pods carrying a
scheduler decision, an in-memory API server (``MemoryKube``), a minimal kubelet Registration
service and a running agent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from grpclib.server import Server, Stream

from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.backends.base import Backend, BackendSettings
from hami.backends.fake import FakeBackend
from hami.config import Config, from_mapping
from hami.kube.client import node_path, pod_path
from hami.kube.raw import JSON, NotFound, RetryPolicy, Unreachable
from hami.node import NodeAgent
from hami.protocol import keys

NODE = "node-u"
TO_ALLOC = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"


def fake_backend(tmp: Path, count: int = 2, split: int = 4) -> FakeBackend:
    return FakeBackend(
        BackendSettings(
            split_count=split,
            options={
                "devices": [{"count": count, "model": "NVIDIA-Test", "memory": 16384}],
                "uuid_prefix": "GPU-u",
                "hamicore": {"containers_dir": str(tmp / "containers")},
            },
        )
    )


def pod(
    name: str,
    value: str,
    *,
    containers: int = 1,
    init: int = 0,
    bind_time: str = "100",
    phase: str = "allocating",
    node: str = NODE,
    env: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "annotations": {
                keys.BIND_PHASE: phase,
                keys.VGPU_NODE: node,
                keys.BIND_TIME: bind_time,
                TO_ALLOC: value,
                ALLOCATED: value,
            },
        },
        "spec": {
            "nodeName": node,
            "initContainers": [{"name": f"init{i}"} for i in range(init)],
            "containers": [{"name": f"c{i}", "env": env or []} for i in range(containers)],
        },
        "status": {"phase": "Pending"},
    }


def counting_clock() -> Any:
    start = datetime(2024, 1, 23, 4, 30, 0, tzinfo=UTC)
    ticks = iter(range(10**6))
    return lambda: start + timedelta(seconds=next(ticks))


class MemoryKube:
    """An in-memory API server for nodes and pods (merge patches on annotations) with the
    calls of ``hami.node.allocate.NodeKube``; it raises the real ``NotFound``, and
    ``Unreachable`` while ``down``. ``node_patches`` records every Node patch;
    ``fail_node_patches`` makes the next ones fail as if the API server were away."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {NODE: {"metadata": {"name": NODE}}}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 1
        self.down = False
        self.node_patches: list[dict[str, str | None]] = []
        self.fail_node_patches = 0
        self.policies: list[RetryPolicy] = []  # what with_retry was asked for

    def with_retry(self, policy: RetryPolicy) -> MemoryKube:
        self.policies.append(policy)
        return self

    def _check(self, path: str) -> None:
        if self.down:
            raise Unreachable("apiserver unreachable", path, sent=False)

    async def get_node(self, name: str) -> JSON:
        self._check(node_path(name))
        if name not in self.nodes:
            raise NotFound(404, "NotFound", f'nodes "{name}" not found', node_path(name))
        node = self.nodes[name]
        node["metadata"]["resourceVersion"] = str(self.rv)
        return node

    async def get_pod(self, namespace: str, name: str) -> JSON:
        self._check(pod_path(namespace, name))
        if (namespace, name) not in self.pods:
            raise NotFound(404, "NotFound", f'pods "{name}" not found', pod_path(namespace, name))
        return self.pods[(namespace, name)]

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[JSON]:
        self._check("/api/v1/pods")
        return [p for p in self.pods.values() if p["spec"]["nodeName"] == NODE]

    async def patch_node_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> JSON:
        self._check(node_path(name))
        if self.fail_node_patches:
            self.fail_node_patches -= 1
            raise Unreachable("apiserver down", node_path(name), sent=False)
        self.node_patches.append(dict(annotations))
        self._merge(self.nodes[name], annotations)
        return self.nodes[name]

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> JSON:
        self._check(pod_path(namespace, name))
        self._merge(self.pods[(namespace, name)], annotations)
        return self.pods[(namespace, name)]

    def _merge(self, obj: dict[str, Any], annotations: Mapping[str, str | None]) -> None:
        self.rv += 1
        current = obj["metadata"].setdefault("annotations", {})
        for key, value in annotations.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value

    def add(self, p: dict[str, Any]) -> None:
        self.pods[(p["metadata"]["namespace"], p["metadata"]["name"])] = p

    def annotations(self, name: str) -> dict[str, str]:
        result: dict[str, str] = self.pods[("ns", name)]["metadata"]["annotations"]
        return result


class MiniKubelet(api_grpc.RegistrationBase):
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.requests: list[api_pb2.RegisterRequest] = []
        self.server: Server | None = None

    async def Register(self, stream: Stream[api_pb2.RegisterRequest, api_pb2.Empty]) -> None:
        request = await stream.recv_message()
        assert request is not None
        self.requests.append(request)
        await stream.send_message(api_pb2.Empty())

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / "kubelet.sock").unlink()
        self.server = Server([self])
        await self.server.start(path=str(self.directory / "kubelet.sock"))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            (self.directory / "kubelet.sock").unlink()


@contextlib.contextmanager
def short_tmp_dir() -> Iterator[Path]:
    """A directory under /tmp short enough for unix socket paths (a test module's
    ``short_dir`` fixture: fixtures are not imported across test modules)."""
    path = Path(tempfile.mkdtemp(prefix="hn-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def running_agent(
    short_dir: Path,
    kube: Any,
    backend: Backend,
    cfg: Config | None = None,
    *,
    name: str = "fake",
) -> AsyncIterator[NodeAgent]:
    """A node agent on ``kube`` (a ``MemoryKube`` or a real ``Kube``) serving ``backend``
    as backend ``name``, ready (the backend stays the caller's to close)."""
    agent = NodeAgent(
        cfg or Config(),
        node_name=NODE,
        kube=kube,
        backends={name: backend},
        register_period=0.2,
        device_plugin_dir=str(short_dir),
        http_port=0,
        http_address="127.0.0.1",
        kubelet_poll=0.05,
        min_backoff=0.05,
    )
    task = asyncio.create_task(agent.run())
    try:
        await agent.wait_ready(10)
        yield agent
    finally:
        await agent.stop()
        await task


@contextlib.asynccontextmanager
async def kubelet_agent(
    kube: Any, kubelet: Any, node: str, word: str, backend: Backend
) -> AsyncIterator[NodeAgent]:
    """A node agent on a real API server serving ``backend`` (as backend ``word``, the
    only one enabled) to the kubelet emulator ``kubelet`` of ``node``, ready; stopped
    after. The caller waits for the resources it needs (``kubelet.wait_for_resource``)."""
    backends = {"nvidia": {"enabled": word == "nvidia"}, word: {"enabled": True}}
    agent = NodeAgent(
        from_mapping({"backends": backends}, env={}),
        node_name=node,
        kube=kube,
        backends={word: backend},
        register_period=1,
        device_plugin_dir=str(kubelet.plugin_dir),
        serve_http=False,
        kubelet_poll=0.2,
    )
    task = asyncio.create_task(agent.run())
    try:
        await agent.wait_ready()
        yield agent
    finally:
        await agent.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def write_fake_node_config(
    node: str, plugin_dir: Path, work_dir: Path, level: str = "warning"
) -> Path:
    """A config file for `hami run --role node` with the fake backend (one A100, split 2)
    serving ``plugin_dir``; written as ``work_dir/hami.yaml``."""
    config = {
        "log": {"level": level, "format": "json"},
        "node": {
            "register_period": "1s",
            "device_plugin_dir": str(plugin_dir),
            "http": {"address": "127.0.0.1", "port": 0},
        },
        "backends": {
            "nvidia": {"enabled": False},
            "fake": {
                "enabled": True,
                "split_count": 2,
                "devices": [{"count": 1, "model": "NVIDIA-A100", "memory": 40960}],
                "uuid_prefix": f"GPU-{node}",
                "hamicore": {"containers_dir": str(work_dir / "containers")},
            },
        },
    }
    path = work_dir / "hami.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def spawn_node_agent(
    config: Path, kubeconfig: Path, node: str, *, output: int | None = asyncio.subprocess.PIPE
) -> asyncio.subprocess.Process:
    """``hami run --role node`` as its own process (``NODE_NAME`` from the environment, as
    the DaemonSet's downward API sets it); ``output``: where stdout and stderr go."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hami",
        "run",
        "--role",
        "node",
        "--config",
        str(config),
        "--kubeconfig",
        str(kubeconfig),
        env={**os.environ, "NODE_NAME": node},
        stdout=output,
        stderr=asyncio.subprocess.STDOUT if output == asyncio.subprocess.PIPE else output,
    )
