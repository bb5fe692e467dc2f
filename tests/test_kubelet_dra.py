"""The kubelet emulator's DRA side against the real control plane (issue 14 item 3).

kube-scheduler (default plugins only, no extender) allocates claims against a ResourceSlice
the test publishes, kube-controller-manager's resourceclaim controller turns templates into
claims, and a small DRA driver written here (registration socket + DRA gRPC service, CDI
spec files) answers the emulator. What is checked is what kubelet 1.36 does: discovery
through the registration directory, NodePrepareResources before the pod runs with the CDI
environment applied, the pod left Pending with a FailedPrepareDynamicResources Event (and
tried again) when prepare fails, NodeUnprepareResources when the pod goes.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from grpclib.server import Server, Stream

from hami._proto.dra.v1 import api_grpc as dra_grpc
from hami._proto.dra.v1 import api_pb2 as dra_pb2
from hami._proto.pluginregistration.v1 import api_grpc as reg_grpc
from hami._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from hami.kube.client import Kube, pod_path
from hami.kube.raw import KubeError
from hami.testkit.cluster import poll
from hami.testkit.controlplane import ControllerManagerProcess, ControlPlane
from hami.testkit.kubelet_dra import claim_path

pytestmark = [pytest.mark.controlplane]

RESOURCE = "/apis/resource.k8s.io/v1"
SCHEDULER = "dra-test-scheduler"


class _DRAService(dra_grpc.DRAPluginBase):
    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver

    async def NodePrepareResources(
        self,
        stream: Stream[dra_pb2.NodePrepareResourcesRequest, dra_pb2.NodePrepareResourcesResponse],
    ) -> None:
        await self.driver.NodePrepareResources(stream)

    async def NodeUnprepareResources(
        self,
        stream: Stream[
            dra_pb2.NodeUnprepareResourcesRequest, dra_pb2.NodeUnprepareResourcesResponse
        ],
    ) -> None:
        await self.driver.NodeUnprepareResources(stream)


class FakeDriver(reg_grpc.RegistrationBase):
    """A DRA driver with one CDI device per claim whose env says what was allocated."""

    def __init__(self, name: str, kube: Kube, plugin_dir: Path, registry: Path, cdi: Path) -> None:
        self.name = name
        self.kube = kube
        self.endpoint = plugin_dir / "dra.sock"
        self.reg_socket = registry / f"{name}-reg.sock"
        self.cdi = cdi
        self.registered: list[reg_pb2.RegistrationStatus] = []
        self.fail: set[str] = set()  # claim names whose prepare fails
        self.unprepared: list[str] = []
        self._servers: list[Server] = []

    async def start(self) -> None:
        self.endpoint.parent.mkdir(parents=True, exist_ok=True)
        self.reg_socket.parent.mkdir(parents=True, exist_ok=True)
        self.cdi.mkdir(parents=True, exist_ok=True)
        services: tuple[Any, Any] = (_DRAService(self), self)
        for sock, service in zip((self.endpoint, self.reg_socket), services, strict=True):
            server = Server([service])
            await server.start(path=str(sock))
            self._servers.append(server)

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()

    async def GetInfo(self, stream: Stream[reg_pb2.InfoRequest, reg_pb2.PluginInfo]) -> None:
        await stream.recv_message()
        await stream.send_message(
            reg_pb2.PluginInfo(
                type="DRAPlugin",
                name=self.name,
                endpoint=str(self.endpoint),
                supported_versions=["v1.DRAPlugin"],
            )
        )

    async def NotifyRegistrationStatus(
        self, stream: Stream[reg_pb2.RegistrationStatus, reg_pb2.RegistrationStatusResponse]
    ) -> None:
        msg = await stream.recv_message()
        assert msg is not None
        self.registered.append(msg)
        await stream.send_message(reg_pb2.RegistrationStatusResponse())

    async def NodePrepareResources(
        self,
        stream: Stream[dra_pb2.NodePrepareResourcesRequest, dra_pb2.NodePrepareResourcesResponse],
    ) -> None:
        req = await stream.recv_message()
        assert req is not None
        out = dra_pb2.NodePrepareResourcesResponse()
        for c in req.claims:
            if c.name in self.fail:
                out.claims[c.uid].error = "device is busy (test)"
                continue
            claim = await self.kube.request("GET", claim_path(c.namespace, c.name))
            results = claim["status"]["allocation"]["devices"]["results"]
            env = [f"CLAIM={c.name}"]
            for i, r in enumerate(results):
                env.append(f"DEVICE_{i}={r['device']}")
                env.append(f"MEMORY_{i}={(r.get('consumedCapacity') or {}).get('memory', '')}")
            cdi_id = f"{self.name}/claim={c.uid}"
            spec = {
                "cdiVersion": "0.6.0",
                "kind": f"{self.name}/claim",
                "containerEdits": {"env": ["DRIVER=" + self.name]},
                "devices": [{"name": c.uid, "containerEdits": {"env": env}}],
            }
            (self.cdi / f"{self.name}-{c.uid}.json").write_text(json.dumps(spec))
            out.claims[c.uid].devices.extend(
                dra_pb2.Device(
                    request_names=[r["request"]],
                    pool_name=r["pool"],
                    device_name=r["device"],
                    cdi_device_ids=[cdi_id],
                )
                for r in results
            )
        await stream.send_message(out)

    async def NodeUnprepareResources(
        self,
        stream: Stream[
            dra_pb2.NodeUnprepareResourcesRequest, dra_pb2.NodeUnprepareResourcesResponse
        ],
    ) -> None:
        req = await stream.recv_message()
        assert req is not None
        out = dra_pb2.NodeUnprepareResourcesResponse()
        for c in req.claims:
            (self.cdi / f"{self.name}-{c.uid}.json").unlink(missing_ok=True)
            self.unprepared.append(c.name)
            out.claims[c.uid].CopyFrom(dra_pb2.NodeUnprepareResourceResponse())
        await stream.send_message(out)


@pytest.fixture(scope="module")
def claim_controller(controlplane: ControlPlane) -> Iterator[ControllerManagerProcess]:
    cm = controlplane.start_controller_manager(name="kcm-kubelet-dra")
    yield cm
    cm.stop()
    with contextlib.suppress(ValueError):
        controlplane.controller_managers.remove(cm)


@pytest.fixture
async def dra_node(
    kube: Kube,
    kubelet_factory: Any,
    kube_scheduler: Any,
    claim_controller: ControllerManagerProcess,
) -> AsyncIterator[dict[str, Any]]:
    tag = uuid.uuid4().hex[:6]
    node, driver_name = f"dra-{tag}", f"t{tag}.hami.io"
    base = Path(f"/tmp/kd-{tag}")  # short: unix socket paths are limited to 107 bytes
    registry, cdi = base / "reg", base / "cdi"
    driver = FakeDriver(driver_name, kube, base / "plugin", registry, cdi)
    await driver.start()
    kubelet = await kubelet_factory(
        node,
        plugin_dir=base / "dp",
        labels={"dra-test": tag},
        dra_registry_dir=registry,
        cdi_dirs=[cdi],
        prepare_retry=(0.2, 0.5),
    )
    await kubelet.wait_for_dra_driver(driver_name)
    created: list[str] = []

    async def create(path: str, body: dict[str, Any]) -> None:
        await kube.create(path, body)
        created.append(f"{path}/{body['metadata']['name']}")

    capacity = {
        "memory": {
            "value": "16Gi",
            "requestPolicy": {"default": "16Gi", "validRange": {"min": "1Mi", "step": "1Mi"}},
        }
    }
    await create(
        f"{RESOURCE}/resourceslices",
        {
            "metadata": {"name": f"{node}-slice"},
            "spec": {
                "driver": driver_name,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": f"gpu-{i}",
                        "allowMultipleAllocations": True,
                        "attributes": {"model": {"string": "T4"}},
                        "capacity": capacity,
                    }
                    for i in range(2)
                ],
            },
        },
    )
    await create(
        f"{RESOURCE}/deviceclasses",
        {
            "metadata": {"name": driver_name},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{driver_name}"'}}],
                "extendedResourceName": f"{driver_name}/gpu",
            },
        },
    )
    await kube_scheduler(
        {
            "podInitialBackoffSeconds": 1,
            "podMaxBackoffSeconds": 1,
            "profiles": [{"schedulerName": SCHEDULER}],
        }
    )
    try:
        yield {"node": node, "tag": tag, "driver": driver, "kubelet": kubelet, "cdi": cdi}
    finally:
        await driver.stop()
        for path in created:
            with contextlib.suppress(KubeError):
                await kube.delete(path)
        shutil.rmtree(base, ignore_errors=True)


def _pod(name: str, tag: str, **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    container.update(extra.pop("container", {}))
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {"dra-test": tag},
            "containers": [container],
            **extra,
        },
    }


def _template(name: str, driver: str, memory: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": driver,
                                "capacity": {"requests": {"memory": memory}},
                            },
                        }
                    ]
                }
            }
        },
    }


async def _claim_pod(kube: Kube, namespace: str, env: dict[str, Any], name: str) -> None:
    driver: FakeDriver = env["driver"]
    await kube.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
        _template(f"{name}-tpl", driver.name, "3000Mi"),
    )
    pod = _pod(
        name,
        env["tag"],
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": f"{name}-tpl"}],
        container={"resources": {"claims": [{"name": "gpu"}]}},
    )
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)


async def test_claim_prepared_with_cdi_env_and_unprepared_on_delete(
    kube: Kube, namespace: str, dra_node: dict[str, Any]
) -> None:
    driver: FakeDriver = dra_node["driver"]
    kubelet = dra_node["kubelet"]
    assert driver.registered and driver.registered[-1].plugin_registered
    await _claim_pod(kube, namespace, dra_node, "p1")
    adm = await kubelet.wait_for_admission(namespace, "p1", timeout=60)
    assert adm.phase == "Running", adm
    pod = await kube.get_pod(namespace, "p1")
    assert pod["spec"]["nodeName"] == dra_node["node"]
    (claim_name,) = [s["resourceClaimName"] for s in pod["status"]["resourceClaimStatuses"]]
    claim = await kube.request("GET", claim_path(namespace, claim_name))
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"memory": "3000Mi"}
    env = adm.cdi_env["main"]
    assert env["DRIVER"] == driver.name  # the spec-wide edits apply too
    assert env["CLAIM"] == claim_name
    assert env["DEVICE_0"] == result["device"]
    assert env["MEMORY_0"] == "3000Mi"
    assert adm.envs["main"]["MEMORY_0"] == "3000Mi"
    uid = claim["metadata"]["uid"]
    assert (dra_node["cdi"] / f"{driver.name}-{uid}.json").exists()

    await kube.delete(pod_path(namespace, "p1"))
    await kubelet.wait_for(lambda: claim_name in driver.unprepared, timeout=30)
    assert not (dra_node["cdi"] / f"{driver.name}-{uid}.json").exists()

    async def claim_freed() -> bool:
        try:
            c = await kube.request("GET", claim_path(namespace, claim_name))
        except KubeError as exc:
            return exc.status == 404
        status = c.get("status") or {}
        return not status.get("reservedFor") and not status.get("allocation")

    # the resourceclaim controller drops the reservation and deallocates once the pod is
    # gone (deleting the generated claim is the garbage collector's, not started here)
    await poll(claim_freed, timeout=30, what=f"claim {claim_name} deallocated")


async def test_failed_prepare_leaves_pod_pending_with_event_and_retries(
    kube: Kube, namespace: str, dra_node: dict[str, Any]
) -> None:
    driver: FakeDriver = dra_node["driver"]
    kubelet = dra_node["kubelet"]
    await kube.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
        {
            "metadata": {"name": "shared"},
            "spec": _template("x", driver.name, "1000Mi")["spec"]["spec"],
        },
    )
    driver.fail.add("shared")
    pod = _pod(
        "p2",
        dra_node["tag"],
        resourceClaims=[{"name": "gpu", "resourceClaimName": "shared"}],
        container={"resources": {"claims": [{"name": "gpu"}]}},
    )
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    await kubelet.wait_for(
        lambda: (
            (a := kubelet.admissions.get((namespace, "p2"))) is not None and a.prepare_failures >= 2
        ),
        timeout=60,
    )
    adm = kubelet.admissions[(namespace, "p2")]
    assert adm.phase == "Pending"
    assert adm.reason == "FailedPrepareDynamicResources"
    assert "device is busy (test)" in (adm.message or "")
    current = await kube.get_pod(namespace, "p2")
    assert current["status"].get("phase") == "Pending"

    async def event_written() -> bool:
        events = await kube.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            query=[("fieldSelector", "involvedObject.name=p2")],
        )
        return any(
            e.get("reason") == "FailedPrepareDynamicResources"
            and e.get("type") == "Warning"
            and "device is busy" in e.get("message", "")
            for e in events.get("items") or []
        )

    await poll(event_written, timeout=30, what="FailedPrepareDynamicResources event")
    driver.fail.clear()  # the next try succeeds, as kubelet's would
    adm = await kubelet.wait_for_admission(namespace, "p2", timeout=30)
    assert adm.phase == "Running"
    assert adm.cdi_env["main"]["CLAIM"] == "shared"


async def test_extended_resource_mapped_to_device_class(
    kube: Kube, namespace: str, dra_node: dict[str, Any]
) -> None:
    driver: FakeDriver = dra_node["driver"]
    kubelet = dra_node["kubelet"]
    resource = f"{driver.name}/gpu"
    pod = _pod("p3", dra_node["tag"], container={"resources": {"limits": {resource: "1"}}})
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    adm = await kubelet.wait_for_admission(namespace, "p3", timeout=60)
    assert adm.phase == "Running", adm
    current = await kube.get_pod(namespace, "p3")
    status = current["status"]["extendedResourceClaimStatus"]
    assert status["requestMappings"][0]["containerName"] == "main"
    assert status["requestMappings"][0]["resourceName"] == resource
    assert adm.cdi_env["main"]["CLAIM"] == status["resourceClaimName"]
    assert adm.cdi_env["main"]["DEVICE_0"] in ("gpu-0", "gpu-1")
