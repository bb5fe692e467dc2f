"""The kubelet DRA plugin over real unix sockets, reading claims from the real API server:
registration, prepare (CDI spec with the HAMi-core contract), idempotence, restart,
per-claim errors, unprepare."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from grpclib.client import Channel

from hami._proto.dra.v1 import api_grpc as dra_grpc
from hami._proto.dra.v1 import api_pb2 as dra_pb2
from hami._proto.pluginregistration.v1 import api_grpc as reg_grpc
from hami._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from hami.backends.base import BackendSettings, Device
from hami.backends.fake import FakeBackend
from hami.dra import cdi
from hami.dra.checkpoint import Checkpoint
from hami.dra.plugin import DRAPluginServer, DRAService
from hami.kube.client import Kube
from hami.node.allocate import check_entry

NODE = "dra-node-a"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
DEVICES = [
    Device("GPU-dra-0", 0, "NVIDIA A100", 40960),
    Device("GPU-dra-1", 1, "NVIDIA A100", 40960),
]


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hdra-", dir="/tmp"))  # short: unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_backend(root: Path) -> FakeBackend:
    options = {"hamicore": {"containers_dir": str(root / "containers")}}
    return FakeBackend(BackendSettings(split_count=4, options=options))


class Plugin:
    """One agent's DRA plugin: service + sockets, startable again over the same dirs."""

    def __init__(self, root: Path, kube: Kube) -> None:
        self.root = root
        self.kube = kube
        self.task: asyncio.Task[None] | None = None
        self.server: DRAPluginServer | None = None

    async def start(self) -> DRAPluginServer:
        checkpoint = Checkpoint(self.root / "plugins" / "nvidia.hami.io" / "checkpoint.json")
        checkpoint.load()
        service = DRAService(
            node=NODE,
            backend=make_backend(self.root),
            devices=lambda: list(DEVICES),
            kube=self.kube,
            check=check_entry,
            cdi_dir=str(self.root / "cdi"),
            checkpoint=checkpoint,
        )
        self.server = DRAPluginServer(
            service,
            plugins_dir=self.root / "plugins",
            registry_dir=self.root / "registry",
            poll=0.2,
        )
        self.task = asyncio.create_task(self.server.run())
        async with asyncio.timeout(10):
            await self.server.serving.wait()
        return self.server

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None


@pytest.fixture
async def plugin(root: Path, kube: Kube) -> AsyncIterator[Plugin]:
    p = Plugin(root, kube)
    await p.start()
    yield p
    await p.stop()


async def make_claim(
    kube: Kube, ns: str, name: str, results: list[dict[str, Any]]
) -> dict[str, Any]:
    """A ResourceClaim with a hand-written allocation in its status (as kube-scheduler
    would write it), through the status subresource."""
    created = await kube.create(
        CLAIMS.format(ns=ns),
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "nvidia.hami.io",
                                "capacity": {"requests": {"memory": "3000Mi"}},
                            },
                        }
                    ]
                }
            },
        },
    )
    status = {"status": {"allocation": {"devices": {"results": results}}}}
    await kube.merge_patch(f"{CLAIMS.format(ns=ns)}/{name}/status", status)
    return created


def result(device: str, memory: str, cores: str, share: str, pool: str = NODE) -> dict[str, Any]:
    return {
        "request": "gpu",
        "driver": "nvidia.hami.io",
        "pool": pool,
        "device": device,
        "shareID": share,
        "consumedCapacity": {"memory": memory, "cores": cores, "slots": "1"},
    }


async def prepare(server: DRAPluginServer, *claims: dict[str, Any]) -> Any:
    channel = Channel(path=str(server.dra_socket))
    try:
        stub = dra_grpc.DRAPluginStub(channel)
        request = dra_pb2.NodePrepareResourcesRequest(
            claims=[
                dra_pb2.Claim(
                    namespace=c["metadata"]["namespace"],
                    name=c["metadata"]["name"],
                    uid=c["metadata"]["uid"],
                )
                for c in claims
            ]
        )
        return await stub.NodePrepareResources(request, timeout=30)
    finally:
        channel.close()


async def unprepare(server: DRAPluginServer, *uids: str) -> Any:
    channel = Channel(path=str(server.dra_socket))
    try:
        stub = dra_grpc.DRAPluginStub(channel)
        request = dra_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace="x", name="x", uid=u) for u in uids]
        )
        return await stub.NodeUnprepareResources(request, timeout=30)
    finally:
        channel.close()


SHARE = "5a1e0000-0000-4000-8000-00000000000{}"


async def test_registration_answers_what_kubelet_1_36_expects(plugin: Plugin) -> None:
    server = plugin.server
    assert server is not None
    assert server.reg_socket == plugin.root / "registry" / "nvidia.hami.io-reg.sock"
    channel = Channel(path=str(server.reg_socket))
    try:
        stub = reg_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=10)
        assert info.type == "DRAPlugin"
        assert info.name == "nvidia.hami.io"
        assert info.endpoint == str(plugin.root / "plugins" / "nvidia.hami.io" / "dra.sock")
        assert list(info.supported_versions) == ["v1.DRAPlugin"]
        await stub.NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=True), timeout=10
        )
    finally:
        channel.close()
    assert server.registration.registered.is_set()


async def test_prepare_writes_the_cdi_spec_idempotently_across_restarts(
    plugin: Plugin, kube: Kube, namespace: str
) -> None:
    claim = await make_claim(
        kube, namespace, "c1", [result("nvidia-1", "3000Mi", "30", SHARE.format(1))]
    )
    uid = claim["metadata"]["uid"]
    server = plugin.server
    assert server is not None
    answer = await prepare(server, claim)
    one = answer.claims[uid]
    assert one.error == ""
    assert [(d.pool_name, d.device_name, d.share_id) for d in one.devices] == [
        (NODE, "nvidia-1", SHARE.format(1))
    ]
    assert list(one.devices[0].cdi_device_ids) == [f"nvidia.hami.io/claim={uid}"]
    spec_path = plugin.root / "cdi" / f"nvidia.hami.io-{uid}.json"
    spec = json.loads(spec_path.read_text())
    env = cdi.spec_env(spec)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-dra-1"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert (plugin.root / "containers" / f"{uid}_claim-c1").is_dir()

    again = await prepare(server, claim)
    assert again.claims[uid] == one
    registry = server.service.metrics.registry
    labels = {"driver": "nvidia.hami.io"}
    assert (
        registry.get_sample_value("hami_dra_prepare_total", {**labels, "result": "prepared"}) == 1
    )
    assert (
        registry.get_sample_value("hami_dra_prepare_total", {**labels, "result": "repeated"}) == 1
    )
    assert registry.get_sample_value("hami_dra_prepared_claims", labels) == 1
    assert json.loads(spec_path.read_text()) == spec  # same cache path: not re-allocated

    # an agent restart: the checkpoint answers even once the API server no longer has it
    await plugin.stop()
    await kube.delete(f"{CLAIMS.format(ns=namespace)}/c1")
    server = await plugin.start()
    restarted = await prepare(server, claim)
    assert restarted.claims[uid] == one

    done = await unprepare(server, uid)
    assert done.claims[uid].error == ""
    assert not spec_path.exists()
    checkpoint = json.loads(
        (plugin.root / "plugins" / "nvidia.hami.io" / "checkpoint.json").read_text()
    )
    assert uid not in checkpoint["claims"]
    # unprepare of a claim it does not know: nothing to undo, no error
    assert (await unprepare(server, uid)).claims[uid].error == ""


async def test_errors_are_per_claim(plugin: Plugin, kube: Kube, namespace: str) -> None:
    good = await make_claim(
        kube, namespace, "good", [result("nvidia-0", "1Gi", "0", SHARE.format(2))]
    )
    foreign = await make_claim(
        kube, namespace, "foreign", [result("nvidia-0", "1Gi", "0", SHARE.format(3), "node-b")]
    )
    forged = await make_claim(
        kube, namespace, "forged", [result("nvidia-0", "99999Mi", "0", SHARE.format(4))]
    )
    missing = {"metadata": {"namespace": namespace, "name": "gone", "uid": "no-such-uid"}}
    server = plugin.server
    assert server is not None
    answer = await prepare(server, good, foreign, forged, missing)
    assert answer.claims[good["metadata"]["uid"]].error == ""
    assert "another node" in answer.claims[foreign["metadata"]["uid"]].error
    assert "outside 0..40960 MiB" in answer.claims[forged["metadata"]["uid"]].error
    assert "404" in answer.claims["no-such-uid"].error
    errors = server.service.metrics.registry.get_sample_value(
        "hami_dra_prepare_total", {"driver": "nvidia.hami.io", "result": "error"}
    )
    assert errors == 3
    specs = sorted(p.name for p in (plugin.root / "cdi").iterdir())
    assert specs == [f"nvidia.hami.io-{good['metadata']['uid']}.json"]


async def test_concurrent_prepares_of_one_claim_agree(
    plugin: Plugin, kube: Kube, namespace: str
) -> None:
    """kubelet may retry while the first call is still reading the claim: one allocation
    (one HAMi-core cache path), one spec, the same answer for both."""
    claim = await make_claim(
        kube, namespace, "twice", [result("nvidia-0", "2Gi", "20", SHARE.format(5))]
    )
    uid = claim["metadata"]["uid"]
    server = plugin.server
    assert server is not None
    with structlog.testing.capture_logs() as logs:
        first, second = await asyncio.gather(prepare(server, claim), prepare(server, claim))
    assert [e["uid"] for e in logs if e["event"] == "dra_claim_prepared"] == [uid]
    assert first.claims[uid].error == ""
    assert first.claims[uid] == second.claims[uid]
    spec = json.loads((plugin.root / "cdi" / f"nvidia.hami.io-{uid}.json").read_text())
    checkpoint = json.loads(
        (plugin.root / "plugins" / "nvidia.hami.io" / "checkpoint.json").read_text()
    )
    assert checkpoint["claims"][uid]["spec"] == spec
    assert cdi.spec_env(spec)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
