"""Admin-access claims on the real control plane (issue 22 item 4): kube-apiserver 1.36 admits
``adminAccess: true`` only in a namespace labelled ``resource.kubernetes.io/admin-access:
"true"`` (the DRAAdminAccess gate is GA and locked on: no flag), kube-scheduler alone gives
such a claim devices that ordinary claims already share, without counting it, and the
node agent prepares it with the devices visible and no HAMi-core limits, while the
ordinary claim on the same device keeps its own.

One node, three A100s (40960 MiB, split count 10): nvidia-0 shared by a 3000 MiB claim,
nvidia-1 held whole, nvidia-2 free.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from hami.dra import names
from hami.kube.raw import KubeError
from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, phase_of, poll
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import claims_path, templates_path
from hami.testkit.kubelet_dra import claim_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

NODE = "gpu-adm"
DRIVER = "nvidia.hami.io"
LABEL = "resource.kubernetes.io/admin-access"
HAMICORE_ENV = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    nodes = (NodeSpec(NODE, ({"count": 3, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},)),)
    async with LocalCluster(
        nodes, plane=controlplane, timing=Timing(handshake_timeout=3.0), mode="dra"
    ) as c:
        yield c


def exactly(
    *, index: int | None = None, mem: str | None = None, cores: int | None = None, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": DRIVER, **extra}
    if index is not None:
        expression = f'device.attributes["{DRIVER}"].index == {index}'
        body["selectors"] = [{"cel": {"expression": expression}}]
    wanted = {"memory": mem} if mem else {}
    if cores is not None:
        wanted["cores"] = str(cores)
    if wanted:
        body["capacity"] = {"requests": wanted}
    return body


def claim(name: str, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def admin(**kwargs: Any) -> dict[str, Any]:
    # 1Mi: kube-scheduler still checks an admin request against what is left on the
    # device (it only does not count it afterwards), and the published default is the
    # whole device, which a shared device no longer has
    return exactly(adminAccess=True, mem="1Mi", **kwargs)


async def run_pod(cluster: LocalCluster, namespace: str, name: str, claim_name: str) -> Any:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": "hami-scheduler",
            "nodeSelector": cluster.node_selector,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "c0", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
    }
    await cluster.kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    found: dict[str, Any] = {}

    async def running() -> bool:
        found["pod"] = await cluster.kube.get_pod(namespace, name)
        return phase_of(found["pod"]) != "Pending"

    await poll(running, 60, f"pod {namespace}/{name}")
    assert phase_of(found["pod"]) == "Running", found["pod"].get("status")
    return found["pod"]


async def results(cluster: LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    got = await cluster.kube.request("GET", claim_path(namespace, name))
    out: list[dict[str, Any]] = got["status"]["allocation"]["devices"]["results"]
    return out


def cdi_spec(cluster: LocalCluster, uid: str) -> dict[str, Any]:
    cdi_dir = Path(cluster.nodes[NODE].cfg.node.dra.cdi_dir)
    spec: dict[str, Any] = json.loads((cdi_dir / names.cdi_spec_file(DRIVER, uid)).read_text())
    return spec


async def claim_uid(cluster: LocalCluster, namespace: str, name: str) -> str:
    got = await cluster.kube.request("GET", claim_path(namespace, name))
    return str(got["metadata"]["uid"])


@pytest_asyncio.fixture(loop_scope="module")
async def admin_namespace(cluster: LocalCluster) -> AsyncIterator[str]:
    namespace = f"{cluster.namespace}-admin"
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {LABEL: "true"}},
    }
    await cluster.kube.create("/api/v1/namespaces", body)
    try:
        yield namespace
    finally:
        for pod in await cluster.kube.list_pods(namespace=namespace):
            with contextlib.suppress(KubeError):
                await cluster.kube.delete(
                    f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                    {"gracePeriodSeconds": 0},
                )
        with contextlib.suppress(KubeError):
            await cluster.kube.delete(f"/api/v1/namespaces/{namespace}")


async def test_admin_claim_shares_used_devices_without_limits(
    cluster: LocalCluster, admin_namespace: str
) -> None:
    ns, kube = cluster.namespace, cluster.kube
    # ordinary claims: 3000 MiB / 30 % of nvidia-0, all of nvidia-1
    await kube.create(claims_path(ns), claim("work", exactly(index=0, mem="3000Mi", cores=30)))
    await kube.create(claims_path(ns), claim("whole", exactly(index=1)))
    await run_pod(cluster, ns, "work", "work")
    await run_pod(cluster, ns, "whole", "whole")
    work_uid = await claim_uid(cluster, ns, "work")
    work_spec = cdi_spec(cluster, work_uid)
    work_env = (await cluster.admission(await cluster.get_pod("work"))).cdi_env["c0"]
    assert work_env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert work_env["CUDA_DEVICE_SM_LIMIT"] == "30"

    # an admin claim is given nvidia-0, which "work" already shares
    await kube.create(claims_path(admin_namespace), claim("one", admin(index=0)))
    one_pod = await run_pod(cluster, admin_namespace, "mon-one", "one")
    (result,) = await results(cluster, admin_namespace, "one")
    assert (result["device"], result["adminAccess"]) == ("nvidia-0", True)
    uuid0 = cluster.nodes[NODE].uuids[0]
    env = (await cluster.admission(one_pod)).cdi_env["c0"]
    assert env == {"NVIDIA_VISIBLE_DEVICES": uuid0}
    one_edits = cdi_spec(cluster, await claim_uid(cluster, admin_namespace, "one"))
    assert "mounts" not in one_edits["devices"][0]["containerEdits"]  # no libvgpu, no cache

    # allocationMode All: every device the request still fits, in use or not; nvidia-1,
    # held whole, has no MiB left, and kube-scheduler 1.36 checks even an admin request
    # against what is left (docs/dra.md "Admin access")
    await kube.create(claims_path(admin_namespace), claim("all", admin(allocationMode="All")))
    all_pod = await run_pod(cluster, admin_namespace, "mon-all", "all")
    got = await results(cluster, admin_namespace, "all")
    assert sorted(r["device"] for r in got) == ["nvidia-0", "nvidia-2"]
    assert all(r.get("adminAccess") is True for r in got)
    env = (await cluster.admission(all_pod)).cdi_env["c0"]
    uuids = cluster.nodes[NODE].uuids
    assert set(env) == {"NVIDIA_VISIBLE_DEVICES"}
    assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted([uuids[0], uuids[2]])
    assert not any(key.startswith(HAMICORE_ENV) for key in env)

    # the ordinary claim is untouched, and the admin claims consumed nothing: the rest of
    # nvidia-0 (37960 MiB) and the whole of nvidia-2 still fit ordinary claims
    assert cdi_spec(cluster, work_uid) == work_spec
    (work,) = await results(cluster, ns, "work")
    assert work["consumedCapacity"]["memory"] == "3000Mi"
    await kube.create(claims_path(ns), claim("rest", exactly(index=0, mem="37960Mi")))
    await kube.create(claims_path(ns), claim("free", exactly(index=2)))
    await run_pod(cluster, ns, "rest", "rest")
    await run_pod(cluster, ns, "free", "free")
    rest_env = (await cluster.admission(await cluster.get_pod("rest"))).cdi_env["c0"]
    assert rest_env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "37960m"


async def test_admin_access_is_refused_in_an_unlabelled_namespace(cluster: LocalCluster) -> None:
    """kube-apiserver's own check (DRAAdminAccess), on claims and on templates alike."""
    body = claim("sneaky", admin(allocationMode="All"))
    with pytest.raises(KubeError) as refused:
        await cluster.kube.create(claims_path(cluster.namespace), body)
    assert refused.value.status == 422
    assert (
        "spec.devices.requests[0].adminAccess: Forbidden: admin access to devices requires "
        f"the `{LABEL}: true` label on the containing namespace"
    ) in str(refused.value)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "sneaky"},
        "spec": {"spec": body["spec"]},
    }
    with pytest.raises(KubeError) as refused:
        await cluster.kube.create(templates_path(cluster.namespace), template)
    assert refused.value.status == 422
    assert "requires the `resource.kubernetes.io/admin-access: true` label" in str(refused.value)
