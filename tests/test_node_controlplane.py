"""The node role against the real control plane and the kubelet emulator (issue 4)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami import log
from hami.backends.base import BackendSettings
from hami.backends.fake import FakeBackend
from hami.config import Config
from hami.kube.client import Kube
from hami.node import NodeAgent
from hami.protocol import keys
from hami.testkit import ControlPlane, KubeletEmulator
from hami.testkit.cluster import poll

SPLIT = 4
RESOURCE = "nvidia.com/gpu"
TO_ALLOC = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"
REGISTER = "hami.io/node-nvidia-register"
HANDSHAKE = "hami.io/node-handshake-nvidia"

AgentFactory = Callable[..., Awaitable[NodeAgent]]


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> None:
    """Another test's cli.main may have pointed logging at a capture stream closed since."""
    log.configure("info", "console", stream=sys.__stderr__)


def counting_clock() -> Callable[[], datetime]:
    """Every call is one minute later: each heartbeat value differs from the last."""
    start = datetime(2024, 1, 23, 4, 30, 0, tzinfo=UTC)
    ticks = iter(range(10**6))
    return lambda: start + timedelta(minutes=next(ticks))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def host_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hn-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_backend(node: str, host_dir: Path, count: int = 2) -> FakeBackend:
    return FakeBackend(
        BackendSettings(
            split_count=SPLIT,
            options={
                "devices": [
                    {"count": count, "model": "NVIDIA-Tesla V100-PCIE-32GB", "memory": 32768}
                ],
                "uuid_prefix": f"GPU-{node}",
                "hamicore": {"containers_dir": str(host_dir / "containers")},
            },
        )
    )


@pytest.fixture
async def agent_factory(controlplane: ControlPlane, host_dir: Path) -> AsyncIterator[AgentFactory]:
    running: list[tuple[NodeAgent, asyncio.Task[None]]] = []

    async def make(kubelet: KubeletEmulator, **kwargs: Any) -> NodeAgent:
        backend = kwargs.pop("backend", None) or make_backend(kubelet.node_name, host_dir)
        options: dict[str, Any] = {
            "node_name": kubelet.node_name,
            "kubeconfig": str(controlplane.kubeconfig),
            "backends": {"fake": backend},
            "register_period": 0.5,
            "device_plugin_dir": str(kubelet.plugin_dir),
            "http_address": "127.0.0.1",
            "http_port": 0,
            "kubelet_poll": 0.2,
            "min_backoff": 0.2,
        }
        options.update(kwargs)
        agent = NodeAgent(Config(), **options)
        task = asyncio.create_task(agent.run(), name=f"agent[{kubelet.node_name}]")
        running.append((agent, task))
        await agent.wait_ready(30)
        return agent

    yield make
    for agent, task in running:
        await agent.stop()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def node_annotations(kube: Kube, name: str) -> dict[str, str]:
    node = await kube.get_node(name)
    found: dict[str, str] = node["metadata"].get("annotations") or {}
    return found


# --------------------------------------------------------------------------- registration


async def test_registration_annotations_and_heartbeat(
    kubelet_factory: Any, agent_factory: AgentFactory, kube: Kube
) -> None:
    node = unique("n-reg")
    kubelet = await kubelet_factory(node)
    await agent_factory(kubelet, now=counting_clock())
    seen: list[str] = []

    async def four_heartbeats() -> bool:
        annotations = await node_annotations(kube, node)
        value = annotations.get(HANDSHAKE)
        if value and (not seen or seen[-1] != value):
            seen.append(value)
        return len(seen) >= 4

    await poll(four_heartbeats, 20, "4 distinct heartbeats")
    annotations = await node_annotations(kube, node)
    assert annotations[REGISTER] == (
        f"GPU-{node}-0,{SPLIT},32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
        f"GPU-{node}-1,{SPLIT},32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
    )
    # The first write happened at start-up (tick 0); each period wrote a new stamp.
    assert seen[0] == "Reported_2024-01-23 04:30:00"
    assert seen[1:4] == [
        "Reported_2024-01-23 04:31:00",
        "Reported_2024-01-23 04:32:00",
        "Reported_2024-01-23 04:33:00",
    ]


async def test_kubelet_restart_reregisters_and_restores_allocatable(
    kubelet_factory: Any, agent_factory: AgentFactory, kube: Kube
) -> None:
    node = unique("n-rst")
    kubelet = await kubelet_factory(node)
    agent = await agent_factory(kubelet)
    await kubelet.wait_for_resource(RESOURCE, healthy=2 * SPLIT)
    assert len(kubelet.registrations) == 1

    async def allocatable(expected: str) -> bool:
        obj = await kube.get_node(node)
        return bool(obj.get("status", {}).get("allocatable", {}).get(RESOURCE) == expected)

    await poll(lambda: allocatable(str(2 * SPLIT)), 10, "allocatable 8")
    await kubelet.restart()
    await kubelet.wait_for(lambda: len(kubelet.registrations) >= 2, 10)
    await kubelet.wait_for_resource(RESOURCE, healthy=2 * SPLIT, timeout=10)
    await poll(lambda: allocatable(str(2 * SPLIT)), 10, "allocatable restored")
    assert agent.plugins["fake"].registrations == 2


# --------------------------------------------------------------------------- allocate


def gpu_container(name: str, count: int, env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "busybox"}
    if count:
        container["resources"] = {"limits": {RESOURCE: str(count)}}
    if env:
        container["env"] = env
    return container


async def create_bound_pod(
    kube: Kube,
    namespace: str,
    node: str,
    name: str,
    value: str | None,
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    *,
    lock: bool = True,
) -> None:
    """Create a pod as the HAMi scheduler leaves it: annotated, node locked, bound."""
    annotations = {
        keys.VGPU_NODE: node,
        keys.VGPU_TIME: "1716199325",
        keys.BIND_TIME: "1716199325",
        keys.BIND_PHASE: "allocating",
    }
    if value is None:
        annotations = {}  # not placed by HAMi at all
    else:
        annotations[ALLOCATED] = value
        annotations[TO_ALLOC] = value
    if lock:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await kube.patch_node_annotations(node, {keys.NODE_LOCK: f"{stamp},{namespace},{name}"})
    spec: dict[str, Any] = {"nodeName": node, "containers": containers}
    if init:
        spec["initContainers"] = init
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": spec,
    }
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)


def mounts(response: Any) -> list[tuple[str, str, bool]]:
    return [(m.host_path, m.container_path, m.read_only) for m in response.mounts]


CASES = {
    "one-container": (
        "{a},NVIDIA,3000,0:;",
        [],
        [1],
        ";",
    ),
    "two-containers": (
        "{a},NVIDIA,3000,0:;{a},NVIDIA,5000,0:;",
        [],
        [1, 1],
        ";;",
    ),
    "init-without-devices": (
        ";{a},NVIDIA,3000,50:;{b},NVIDIA,4000,60:;",
        [0],
        [1, 1],
        ";;;",
    ),
    "two-devices-one-container": (
        "{a},NVIDIA,1000,30:{b},NVIDIA,1000,30:;",
        [],
        [2],
        ";",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_allocate_from_annotations(
    case: str,
    kubelet_factory: Any,
    agent_factory: AgentFactory,
    kube: Kube,
    namespace: str,
    host_dir: Path,
) -> None:
    template, init_counts, counts, final = CASES[case]
    node = unique("n-alloc")
    kubelet = await kubelet_factory(node)
    await agent_factory(kubelet)
    await kubelet.wait_for_resource(RESOURCE, healthy=2 * SPLIT)
    a, b = f"GPU-{node}-1", f"GPU-{node}-0"  # the scheduler's choice, not kubelet's first
    value = template.format(a=a, b=b)
    init = [gpu_container(f"init{i}", n) for i, n in enumerate(init_counts)]
    containers = [gpu_container(f"c{i}", n) for i, n in enumerate(counts)]
    await create_bound_pod(kube, namespace, node, "p", value, containers, init)
    admission = await kubelet.wait_for_admission(namespace, "p")
    assert admission.phase == "Running", admission.message

    from hami.protocol import decode_pod_devices

    entries = decode_pod_devices(value)
    calls = admission.containers
    assert [c.container for c in calls] == [
        c["name"] for c, e in zip(init + containers, entries, strict=True) if e
    ]
    for call, entry in zip(calls, [e for e in entries if e], strict=True):
        envs = dict(call.response.envs)
        uuids = [d.uuid for d in entry]
        assert envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
        for i, device in enumerate(entry):
            assert envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{device.memory}m"
        assert envs["CUDA_DEVICE_SM_LIMIT"] == str(entry[0].cores)
        assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith("/usr/local/vgpu/")
        assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].endswith(".cache")
        container_dir = host_dir / "containers" / f"{admission.uid}_{call.container}"
        assert container_dir.is_dir()
        assert mounts(call.response) == [
            ("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),
            (str(container_dir), "/usr/local/vgpu", False),
            ("/tmp/vgpulock", "/tmp/vgpulock", False),
            ("/usr/local/vgpu/ld.so.preload", "/etc/ld.so.preload", True),
        ]
        # GetPreferredAllocation steered kubelet to replicas of the chosen devices.
        assert sorted(d.rsplit("-", 1)[0] for d in call.device_ids) == sorted(uuids)

    pod = await kube.get_pod(namespace, "p")
    annotations = pod["metadata"]["annotations"]
    assert annotations[TO_ALLOC] == final
    assert annotations[ALLOCATED] == value
    assert annotations[keys.BIND_PHASE] == "success"
    assert keys.NODE_LOCK not in await node_annotations(kube, node)


async def test_disable_control_drops_the_preload_mount(
    kubelet_factory: Any, agent_factory: AgentFactory, kube: Kube, namespace: str
) -> None:
    node = unique("n-ctl")
    kubelet = await kubelet_factory(node)
    await agent_factory(kubelet)
    await kubelet.wait_for_resource(RESOURCE, healthy=2 * SPLIT)
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    await create_bound_pod(
        kube,
        namespace,
        node,
        "p",
        f"GPU-{node}-0,NVIDIA,3000,0:;",
        [gpu_container("c0", 1, env)],
        lock=False,  # without a lock the oldest allocating pod on the node is taken
    )
    admission = await kubelet.wait_for_admission(namespace, "p")
    assert admission.phase == "Running", admission.message
    paths = [m[1] for m in mounts(admission.containers[0].response)]
    assert "/etc/ld.so.preload" not in paths


# --------------------------------------------------------------------------- failures


async def test_failures_answer_kubelet_mark_failed_and_keep_serving(
    kubelet_factory: Any, agent_factory: AgentFactory, kube: Kube, namespace: str
) -> None:
    node = unique("n-fail")
    kubelet = await kubelet_factory(node)
    agent = await agent_factory(kubelet)
    await kubelet.wait_for_resource(RESOURCE, healthy=2 * SPLIT)
    good = f"GPU-{node}-0,NVIDIA,3000,0:;"

    # No pending pod: a pod that asks for the resource but was not placed by HAMi.
    await create_bound_pod(
        kube, namespace, node, "stray", None, [gpu_container("c0", 1)], lock=False
    )
    admission = await kubelet.wait_for_admission(namespace, "stray")
    assert admission.phase == "Failed"
    assert "no pending pod" in str(admission.message)

    cases = {
        "malformed": ("GPU-x,NVIDIA,lots,0:;", 1, "invalid pod devices value"),
        "mismatch": (good, 2, "device count mismatch"),
    }
    for name, (value, count, cause) in cases.items():
        await create_bound_pod(kube, namespace, node, name, value, [gpu_container("c0", count)])
        admission = await kubelet.wait_for_admission(namespace, name)
        assert admission.phase == "Failed", name
        assert f"pod {namespace}/{name}" in str(admission.message)
        assert cause in str(admission.message)
        pod = await kube.get_pod(namespace, name)
        assert pod["metadata"]["annotations"][keys.BIND_PHASE] == "failed"
        assert keys.NODE_LOCK not in await node_annotations(kube, node)

    # Still serving: a good pod starts.
    await create_bound_pod(kube, namespace, node, "ok", good, [gpu_container("c0", 1)])
    admission = await kubelet.wait_for_admission(namespace, "ok")
    assert admission.phase == "Running", admission.message
    metrics = agent.metrics.render().decode()
    assert 'hami_node_allocate_errors_total{backend="fake"} 3.0' in metrics
    assert 'hami_node_allocate_calls_total{backend="fake"} 4.0' in metrics


# --------------------------------------------------------------------------- API outage


class Proxy:
    """A TCP proxy to the API server that can be taken down and brought back."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for writer in list(self.writers):
                writer.close()
            await self.server.wait_closed()
            self.server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers -= {writer, up_writer}


async def test_api_server_outage_retries_and_recovers(
    controlplane: ControlPlane,
    kubelet_factory: Any,
    agent_factory: AgentFactory,
    kube: Kube,
    host_dir: Path,
) -> None:
    node = unique("n-out")
    kubelet = await kubelet_factory(node)
    proxy = Proxy(int(controlplane.server.rsplit(":", 1)[1]))
    await proxy.start()
    config = yaml.safe_load(controlplane.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    kubeconfig = host_dir / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    try:
        agent = await agent_factory(kubelet, kubeconfig=str(kubeconfig), now=counting_clock())
        registrar = agent.registrars["fake"]

        async def registered() -> bool:
            return REGISTER in await node_annotations(kube, node)

        await poll(registered, 10, "first registration")
        await proxy.stop()

        async def failing() -> bool:
            return registrar.failures >= 2

        await poll(failing, 20, "failed heartbeats while the API server is away")
        before = (await node_annotations(kube, node))[HANDSHAKE]
        await proxy.start()

        async def recovered() -> bool:
            value = (await node_annotations(kube, node)).get(HANDSHAKE)
            return registrar.failures == 0 and value != before

        await poll(recovered, 20, "heartbeat after the API server came back")
        metrics = agent.metrics.render().decode()
        assert 'hami_node_registration_failures_total{backend="fake"}' in metrics
        assert agent.status()["backends"]["fake"]["registration_failures"] == 0
    finally:
        await proxy.stop()


async def test_http_endpoints(
    kubelet_factory: Any, agent_factory: AgentFactory, kube: Kube
) -> None:
    import aiohttp

    node = unique("n-http")
    kubelet = await kubelet_factory(node)
    agent = await agent_factory(kubelet)
    await kubelet.wait_for_resource(RESOURCE, healthy=2 * SPLIT)
    # The device plugin and the Node patch are separate tasks: wait for the patch too.
    await poll(lambda: agent.registrars["fake"].last_success is not None)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{agent.http_port}/healthz") as resp:
            assert resp.status == 200
            body = await resp.json()
            assert body["status"] == "ok" and body["node"] == node
            assert body["backends"]["fake"]["devices"] == 2
        async with session.get(f"http://127.0.0.1:{agent.http_port}/metrics") as resp:
            text = await resp.text()
    assert 'hami_node_devices{backend="fake",health="healthy",type="nvidia"} 2.0' in text
    assert 'hami_node_registration_patches_total{backend="fake"}' in text
    # Counters exist at 0 before their first event (alerts and rate() need the series).
    assert 'hami_node_registration_failures_total{backend="fake"} 0.0' in text
    assert 'hami_node_allocate_errors_total{backend="fake"} 0.0' in text


class EventFake(FakeBackend):
    """A fake backend whose health changes arrive as events, like NVML Xid events."""

    def __init__(self, settings: BackendSettings) -> None:
        super().__init__(settings)
        self.on_change: Callable[[str, bool], None] | None = None
        self.watching = asyncio.Event()

    async def watch_health(self, devices: Any, on_change: Callable[[str, bool], None]) -> None:
        self.on_change = on_change
        self.watching.set()
        await asyncio.Event().wait()


async def test_unhealthy_device_reaches_kubelet_and_node_at_once(
    kubelet_factory: Any, agent_factory: AgentFactory, kube: Kube, host_dir: Path
) -> None:
    node = unique("n-hlth")
    kubelet = await kubelet_factory(node)
    backend = EventFake(make_backend(node, host_dir).settings)
    # A period far longer than the test: only the health event can cause the write.
    await agent_factory(kubelet, backend=backend, register_period=300)
    await kubelet.wait_for_resource(RESOURCE, healthy=2 * SPLIT)
    await asyncio.wait_for(backend.watching.wait(), 10)
    assert backend.on_change is not None
    backend.on_change(f"GPU-{node}-1", False)
    await kubelet.wait_for_resource(RESOURCE, healthy=SPLIT, timeout=10)

    async def marked() -> bool:
        value = (await node_annotations(kube, node)).get(REGISTER, "")
        return f"GPU-{node}-1,{SPLIT},32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,false:" in value

    await poll(marked, 10, "healthy=false in the register annotation")
    backend.on_change(f"GPU-{node}-1", True)
    await kubelet.wait_for_resource(RESOURCE, healthy=2 * SPLIT, timeout=10)
