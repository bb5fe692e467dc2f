"""`helm install` and `helm upgrade` of charts/hami against a real API server: the documented
install and upgrade paths (docs/operations.md "Install", "Upgrade").

The chart's admission policies and webhook apply to the whole cluster, so these tests run
on a control plane of their own instead of the session's shared one.
"""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from _manifest_helpers import apply, documents
from test_chart import CHART, GOHAMI_VALUES, HAMI_VALUES, helm_binary

from hami.kube.client import Kube, open_client
from hami.kube.raw import NotFound
from hami.testkit.controlplane import ControlPlane, ControlPlaneError, find_binaries

pytestmark = pytest.mark.controlplane

RELEASE, NAMESPACE = "hami", "hami-system"
WEBHOOK = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/hami-webhook"
CONFIG = f"/api/v1/namespaces/{NAMESPACE}/configmaps/hami-config"
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nstand-in\n").decode()


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    try:
        own = ControlPlane(binaries=find_binaries())
        own.start()
    except ControlPlaneError as exc:
        pytest.fail(f"cannot start a control plane for the helm tests: {exc}", pytrace=False)
    try:
        yield own
    finally:
        own.stop()


@pytest_asyncio.fixture
async def kube(plane: ControlPlane) -> AsyncIterator[Kube]:
    async with open_client(plane.kubeconfig) as client:
        yield client


def helm(plane: ControlPlane, home: Path, *args: str) -> str:
    binary = helm_binary()
    if not binary.is_file():
        pytest.fail(f"helm not found at {binary}: run `make controlplane`", pytrace=False)
    env = {
        **os.environ,
        # helm's own state stays in the test's directory
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    result = subprocess.run(
        [str(binary), "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stderr}"
    return result.stdout


def split_count(config_map: dict[str, Any]) -> int:
    count: int = yaml.safe_load(config_map["data"]["hami.yaml"])["backends"]["nvidia"][
        "split_count"
    ]
    return count


async def test_plain_manifests_are_adopted_then_upgraded_keeping_the_ca_bundle(
    plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    # 1. an install from docker/manifests (`kubectl apply --server-side -f`), without the
    #    optional ServiceMonitor, and the caBundle the scheduler patches in at start
    docs = [d for d in documents() if d["kind"] != "ServiceMonitor"]
    for doc in docs:
        await apply(kube, doc)
    patch = [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": CA}]
    await kube.request(
        "PATCH", WEBHOOK, body=patch, content_type="application/json-patch+json",
        query=[("fieldManager", "hami-scheduler")],
    )  # fmt: skip

    # 2. the chart takes them over (docs/operations.md "Upgrade"): helm adopts objects it
    #    did not make, and overrides the fields the earlier apply owns
    helm(
        plane, tmp_path, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--take-ownership", "--force-conflicts",
    )  # fmt: skip
    webhook = await kube.request("GET", WEBHOOK)
    assert webhook["webhooks"][0]["clientConfig"]["caBundle"] == CA
    assert split_count(await kube.request("GET", CONFIG)) == 10

    # 3. an upgrade with a changed value: the config follows, the caBundle stays. The
    #    earlier apply's field manager still co-owns every field it set, so an adopted
    #    release's upgrades force those conflicts too.
    helm(
        plane, tmp_path, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--force-conflicts", "--set", "devicePlugin.deviceSplitCount=4",
    )  # fmt: skip
    assert split_count(await kube.request("GET", CONFIG)) == 4
    webhook = await kube.request("GET", WEBHOOK)
    assert webhook["webhooks"][0]["clientConfig"]["caBundle"] == CA
    status = yaml.safe_load(
        helm(plane, tmp_path, "status", RELEASE, "--namespace", NAMESPACE, "-o", "yaml")
    )
    assert status["info"]["status"] == "deployed"
    assert status["version"] == 2


async def test_hami_style_values_install_upgrade_and_uninstall(
    plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    namespace = "gpu-system"
    helm(
        plane, tmp_path, "install", "vgpu", str(CHART), "--namespace", namespace,
        "--create-namespace", "-f", str(HAMI_VALUES),
    )  # fmt: skip
    webhook_path = (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/vgpu-hami-webhook"
    )
    patch = [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": CA}]
    await kube.request(
        "PATCH", webhook_path, body=patch, content_type="application/json-patch+json",
        query=[("fieldManager", "hami-scheduler")],
    )  # fmt: skip
    # a plain upgrade (values reused, one changed) keeps the caBundle the scheduler set
    helm(
        plane, tmp_path, "upgrade", "vgpu", str(CHART), "--namespace", namespace,
        "--reuse-values", "--set", "scheduler.admissionWebhook.failurePolicy=Ignore",
    )  # fmt: skip
    webhook = (await kube.request("GET", webhook_path))["webhooks"][0]
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["clientConfig"]["caBundle"] == CA
    cluster_scoped = [
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/vgpu-hami-webhook",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/vgpu-hami-node-scope",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/vgpu-hami-scheduler",
    ]
    for path in cluster_scoped:
        await kube.request("GET", path)
    deployment = await kube.request(
        "GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/vgpu-hami-scheduler"
    )
    assert deployment["spec"]["replicas"] == 3
    helm(plane, tmp_path, "uninstall", "vgpu", "--namespace", namespace)
    for path in cluster_scoped:
        with pytest.raises(NotFound):
            await kube.request("GET", path)


async def test_a_typical_go_hami_values_file_installs(
    plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    """docs/operations.md "Go HAMi's values": Go HAMi's common overrides, as a Go HAMi user
    writes them, install as they are and the API server stores what they ask for."""
    namespace = "gohami-system"
    helm(
        plane, tmp_path, "install", "vgpu", str(CHART), "--namespace", namespace,
        "--create-namespace", "-f", str(GOHAMI_VALUES),
    )  # fmt: skip
    try:
        apps = f"/apis/apps/v1/namespaces/{namespace}"
        deployment = await kube.request("GET", f"{apps}/deployments/vgpu-hami-scheduler")
        spec = deployment["spec"]["template"]["spec"]
        images = {c["name"]: c["image"] for c in spec["containers"]}
        assert images["kube-scheduler"] == "mirror.example.com/kube-scheduler:v1.34.2"
        assert images["hami"] == "mirror.example.com/hami-py/hami:0.1.0"
        daemonset = await kube.request("GET", f"{apps}/daemonsets/vgpu-hami-node")
        node = daemonset["spec"]["template"]["spec"]
        assert node["runtimeClassName"] == "nvidia"
        assert node["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        service = await kube.request(
            "GET", f"/api/v1/namespaces/{namespace}/services/vgpu-hami-scheduler"
        )
        assert service["spec"]["type"] == "NodePort"
        assert sorted(p["nodePort"] for p in service["spec"]["ports"]) == [31993, 31998]
        await kube.request("GET", "/apis/node.k8s.io/v1/runtimeclasses/nvidia")
        config = yaml.safe_load(
            (
                await kube.request(
                    "GET", f"/api/v1/namespaces/{namespace}/configmaps/vgpu-hami-config"
                )
            )["data"]["hami.yaml"]
        )
        assert config["backends"]["nvidia"]["split_count"] == 5
        assert config["backends"]["nvidia"]["memory_scaling"] == 2
        assert config["backends"]["nvidia"]["resources"]["count"] == "nvidia.com/vgpu"
        assert config["scheduler"]["node_policy"] == "spread"
        assert config["node"]["numa_topology"] is True
        assert config["scheduler"]["webhook"]["runtime_class_name"] == "nvidia"
    finally:
        helm(plane, tmp_path, "uninstall", "vgpu", "--namespace", namespace)
