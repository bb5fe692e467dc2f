"""The deploy manifests in docker/manifests against the real API server (server-side dry-run).

They are the Helm chart's rendering (scripts/gen-manifests.sh; tests/test_chart.py fails
while they differ from charts/hami), so these checks hold for the chart's defaults too.

Schema mistakes, unknown fields (strict field validation) and bad references to config
fail here instead of in an operator's cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from _manifest_helpers import apply, documents

from hami import config
from hami.backends import registry
from hami.kube.client import Kube
from hami.kube.raw import Conflict

pytestmark = pytest.mark.controlplane

# A stand-in for the Prometheus Operator's CRD, so the optional ServiceMonitor is checked too.
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "plural": "servicemonitors",
            "singular": "servicemonitor",
            "kind": "ServiceMonitor",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


async def _ensure(kube: Kube, path: str, body: dict[str, Any]) -> None:
    with contextlib.suppress(Conflict):  # already there from an earlier test
        await kube.request("POST", path, body=body)


async def test_every_manifest_passes_server_side_dry_run(kube: Kube) -> None:
    docs = documents()
    kinds = {doc["kind"] for doc in docs}
    assert {
        "Deployment",
        "DaemonSet",
        "ClusterRole",
        "MutatingWebhookConfiguration",
        "Service",
        "ServiceMonitor",
        "ConfigMap",
    } <= kinds
    # Namespaced objects need their namespace to exist even in a dry run.
    await _ensure(
        kube,
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hami-system"}},
    )
    await _ensure(
        kube, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SERVICE_MONITOR_CRD
    )
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            await _wait_for_crd(kube)
        created = await apply(kube, doc, dry_run=True)
        assert created["kind"] == doc["kind"], created
        assert created["metadata"]["name"] == doc["metadata"]["name"]


async def _wait_for_crd(kube: Kube) -> None:
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + (
        "servicemonitors.monitoring.coreos.com"
    )
    async with asyncio.timeout(20):
        while True:
            crd = await kube.request("GET", path)
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                # Discovery of the new group can lag the condition a little.
                await asyncio.sleep(0.5)
                return
            await asyncio.sleep(0.2)


def test_embedded_configs_are_valid_and_complete() -> None:
    maps = {d["metadata"]["name"]: d for d in documents() if d["kind"] == "ConfigMap"}
    hami_cfg = config.from_mapping(yaml.safe_load(maps["hami-config"]["data"]["hami.yaml"]), env={})
    sched = yaml.safe_load(maps["hami-kube-scheduler"]["data"]["kube-scheduler.yaml"])
    assert sched["profiles"][0]["schedulerName"] == hami_cfg.scheduler.scheduler_name
    (extender,) = sched["extenders"]
    # kube-scheduler in the same pod reaches the extender on loopback only (issue 9 item 9)
    listener = hami_cfg.scheduler.extender
    assert listener.address == "127.0.0.1"
    assert extender["urlPrefix"] == f"http://127.0.0.1:{listener.port}"
    assert (extender["filterVerb"], extender["bindVerb"]) == ("filter", "bind")
    managed = {r["name"] for r in extender["managedResources"] if r["ignoredByScheduler"]}
    # Every built-in hardware backend's resources are routed to the extender.
    for name in ("nvidia", "mlu"):
        backend = registry.create(name, hami_cfg.backends[name].settings(name))
        assert set(backend.resources.all()) <= managed, name


def test_workloads_use_the_ports_and_files_the_config_names() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in documents()}
    maps = docs[("ConfigMap", "hami-config")]
    hami_cfg = config.from_mapping(yaml.safe_load(maps["data"]["hami.yaml"]), env={})
    scheduler = docs[("Deployment", "hami-scheduler")]["spec"]["template"]["spec"]
    hami = next(c for c in scheduler["containers"] if c["name"] == "hami")
    ports = {p["name"]: p["containerPort"] for p in hami["ports"]}
    assert ports == {
        "http": hami_cfg.scheduler.http.port,
        "webhook": hami_cfg.scheduler.webhook.port,
    }
    service = docs[("Service", "hami-scheduler")]["spec"]
    assert hami_cfg.scheduler.extender.port not in {p["port"] for p in service["ports"]}
    mounts = {m["mountPath"] for m in hami["volumeMounts"]}
    # tls_mode self: the certificate comes from its Secret through the API, its files go
    # to /tmp; files or cert-manager read a mounted Secret
    if hami_cfg.scheduler.webhook.tls_mode == "self":
        assert "/tmp" in mounts
    else:
        assert str(Path(hami_cfg.scheduler.webhook.cert_file).parent) in mounts
    node = docs[("DaemonSet", "hami-node")]["spec"]["template"]["spec"]
    agent = node["containers"][0]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    node_mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    assert {hami_cfg.node.device_plugin_dir, "/usr/local/vgpu"} <= node_mounts
    # kubelet creates HAMi-core's lock directory for the init container's mount
    init = {m["mountPath"] for c in node["initContainers"] for m in c["volumeMounts"]}
    assert "/tmp/vgpulock" in init
    assert {p["containerPort"] for p in agent["ports"]} == {hami_cfg.node.http.port}


def _workloads() -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in documents()
        if d["kind"] in ("Deployment", "DaemonSet")
    }


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod.get("initContainers") or []) + list(pod["containers"])


# The only containers that run as root, and why (docs/node.md): they write root-owned host
# directories. Everything else runs as a non-root user.
ROOT = {("hami-node", "install-hami-core"), ("hami-node", "hami")}
# Host paths the node agent keeps (docs/node.md says why each one).
NODE_HOST_PATHS = {"/var/lib/kubelet/device-plugins", "/usr/local/vgpu", "/tmp/vgpulock"}


def test_every_container_is_locked_down() -> None:
    for workload, pod in _workloads().items():
        pod_context = pod.get("securityContext") or {}
        assert pod_context.get("seccompProfile") == {"type": "RuntimeDefault"}, workload
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(key), (workload, key)
        for container in _containers(pod):
            where = (workload, container["name"])
            context = container.get("securityContext") or {}
            assert context.get("privileged") is not True, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert context.get("capabilities") == {"drop": ["ALL"]}, where
            effective = {**pod_context, **context}
            if where in ROOT:
                assert effective.get("runAsUser") == 0, where
            else:
                assert effective.get("runAsNonRoot") is True, where
                assert effective.get("runAsUser", 0) != 0, where
            resources = container.get("resources") or {}
            assert {"cpu", "memory"} <= set(resources.get("requests") or {}), where
            assert "memory" in (resources.get("limits") or {}), where


def test_node_agent_keeps_only_the_host_paths_it_needs() -> None:
    pod = _workloads()["hami-node"]
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == NODE_HOST_PATHS
    # the agent reads device nodes through the NVIDIA runtime, not through /dev or /sys
    agent = next(c for c in pod["containers"] if c["name"] == "hami")
    mounted = {m["mountPath"] for m in agent["volumeMounts"]}
    assert not {"/dev", "/sys", "/", "/proc"} & mounted
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
