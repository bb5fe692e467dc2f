"""The test control plane itself: binaries, startup errors, teardown, and the API calls the
node and scheduler roles rely on (watch, merge patch, Binding), plus kube-scheduler."""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import watch

from hami.testkit import ControlPlane, ControlPlaneError, find_binaries
from hami.testkit.controlplane import KUBERNETES_VERSION, complete_scheduler_config

ROOT = Path(__file__).resolve().parent.parent
MERGE = "application/merge-patch+json"


def test_version_matches_the_wrapper_module() -> None:
    gomod = (ROOT / "tests/controlplane/go.mod").read_text()
    assert re.search(rf"^require k8s.io/kubernetes {re.escape(KUBERNETES_VERSION)}$", gomod, re.M)


def test_missing_binaries_say_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ControlPlaneError) as err:
        find_binaries({"HAMI_CONTROLPLANE_DIR": str(tmp_path)})
    msg = str(err.value)
    assert "make controlplane" in msg
    assert f"{tmp_path}/kube-apiserver" in msg and "etcd" in msg and "kube-scheduler" in msg


def test_binary_variables_override_the_directory(tmp_path: Path) -> None:
    for name in ("etcd", "kube-apiserver", "kube-scheduler"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    other = tmp_path / "my-etcd"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    found = find_binaries({"HAMI_CONTROLPLANE_DIR": str(tmp_path), "HAMI_ETCD": str(other)})
    assert found.etcd == other
    assert found.kube_apiserver == tmp_path / "kube-apiserver"


def test_scheduler_config_is_completed_but_not_overridden(tmp_path: Path) -> None:
    cfg = complete_scheduler_config(
        "profiles:\n- schedulerName: x\nleaderElection: {leaderElect: true}\n", tmp_path / "kc"
    )
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert cfg["clientConnection"]["kubeconfig"] == str(tmp_path / "kc")
    assert cfg["leaderElection"]["leaderElect"] is True
    assert cfg["profiles"] == [{"schedulerName": "x"}]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes, but Popen.wait reaps it anyway
    return True


@pytest.mark.controlplane
def test_failed_start_reports_the_log_and_leaves_nothing_running() -> None:
    plane = ControlPlane(extra_apiserver_args=["--no-such-flag=1"])
    try:
        with pytest.raises(ControlPlaneError) as err:
            plane.start(timeout=30)
        msg = str(err.value)
        assert "kube-apiserver" in msg and "no-such-flag" in msg, msg
        for proc in (plane.etcd, plane.apiserver):
            assert proc is not None and proc.pid is not None and not _alive(proc.pid)
    finally:
        plane.stop(remove_workdir=True)


@pytest.mark.controlplane
def test_stop_leaves_no_process_behind() -> None:
    with ControlPlane() as plane:
        sched = plane.start_scheduler({"profiles": [{"schedulerName": "nobody"}]})
        pids = [p.pid for p in (plane.etcd, plane.apiserver, sched.process)]
        assert all(pid is not None and _alive(pid) for pid in pids)
        workdir = plane.workdir
    assert not any(_alive(pid) for pid in pids if pid is not None)
    assert not workdir.exists()


@pytest.mark.controlplane
def test_compacted_history_makes_old_watches_expire() -> None:
    with ControlPlane(extra_apiserver_args=["--watch-cache=false"]) as plane:
        ctx = plane.ssl_context()
        url = f"{plane.server}/api/v1/namespaces/default/configmaps"
        versions = []
        for name in ("c0", "c1", "c2"):
            body = json.dumps({"metadata": {"name": name}}).encode()
            req = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, context=ctx) as resp:
                versions.append(json.loads(resp.read())["metadata"]["resourceVersion"])
        version = versions[0]
        assert plane.compact_etcd() >= int(versions[-1])
        watch_url = f"{url}?watch=1&resourceVersion={version}&timeoutSeconds=5"
        with urllib.request.urlopen(watch_url, context=ctx) as resp:
            event = json.loads(resp.readline())
        assert event["type"] == "ERROR" and event["object"]["code"] == 410


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec},
    }


async def test_node_pod_watch_patch_and_bind(core_v1: Any, namespace: str) -> None:
    node = f"n-{uuid.uuid4().hex[:8]}"
    await core_v1.create_node(_node(node))
    try:
        await core_v1.create_namespaced_pod(namespace, _pod("p1"))

        # merge patch: set two annotations, then delete one with null
        await core_v1.patch_node(
            node, {"metadata": {"annotations": {"a": "1", "b": "2"}}}, _content_type=MERGE
        )
        await core_v1.patch_node(
            node, {"metadata": {"annotations": {"b": None}}}, _content_type=MERGE
        )
        got = await core_v1.read_node(node)
        assert got.metadata.annotations == {"a": "1"}
        await core_v1.patch_namespaced_pod(
            "p1", namespace, {"metadata": {"annotations": {"hami.io/x": "y"}}}, _content_type=MERGE
        )

        listing = await core_v1.list_namespaced_pod(namespace)
        version = listing.metadata.resource_version
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p1"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        resp = await core_v1.create_namespaced_binding(namespace, binding, _preload_content=False)
        assert resp.status == 201, await resp.text()
        resp.release()

        async with watch.Watch() as w:
            async with asyncio.timeout(20):
                async for event in w.stream(
                    core_v1.list_namespaced_pod, namespace, resource_version=version
                ):
                    pod = event["object"]
                    if pod.spec.node_name == node:
                        break
        assert event["type"] == "MODIFIED"
        assert pod.metadata.annotations == {"hami.io/x": "y"}
        assert any(c.type == "PodScheduled" and c.status == "True" for c in pod.status.conditions)
    finally:
        await core_v1.delete_node(node)


async def test_kube_scheduler_binds_a_pod_to_a_ready_node(
    core_v1: Any, namespace: str, kube_scheduler: Any, kubelet_factory: Any
) -> None:
    node = f"n-{uuid.uuid4().hex[:8]}"
    kubelet = await kubelet_factory(node)
    await kube_scheduler({"profiles": [{"schedulerName": "hami-test-plain"}]})
    await core_v1.create_namespaced_pod(
        namespace,
        _pod(
            "plain",
            schedulerName="hami-test-plain",
            nodeSelector={"kubernetes.io/hostname": node},
        ),
    )
    admission = await kubelet.wait_for_admission(namespace, "plain")
    assert admission.phase == "Running" and admission.containers == []
    pod = await core_v1.read_namespaced_pod("plain", namespace)
    assert pod.spec.node_name == node
    assert pod.status.phase == "Running"
