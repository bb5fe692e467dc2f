"""A forged pod (spec.nodeName and hand-written decision annotations) on the real control
plane: the node agent answers kubelet's Allocate with an error and fails the pod (issue 9
item 7), and a genuine pod still starts."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from hami import log
from hami.backends.base import BackendSettings
from hami.backends.fake import FakeBackend
from hami.config import Config
from hami.kube.client import Kube
from hami.node import NodeAgent
from hami.protocol import keys
from hami.testkit import ControlPlane

RESOURCE = "nvidia.com/gpu"
TO_ALLOC = "hami.io/vgpu-devices-to-allocate"


async def forge(kube: Kube, namespace: str, node: str, name: str, value: str) -> None:
    annotations = {
        keys.VGPU_NODE: node,
        keys.BIND_PHASE: "allocating",
        keys.BIND_TIME: "1716199325",
        TO_ALLOC: value,
        "hami.io/vgpu-devices-allocated": value,
    }
    container = {"name": "c0", "image": "busybox", "resources": {"limits": {RESOURCE: "1"}}}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"nodeName": node, "containers": [container]},
    }
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)


async def test_forged_decisions_fail_the_pod_not_the_node(
    controlplane: ControlPlane, kubelet_factory: Any, kube: Kube, namespace: str
) -> None:
    log.configure("info", "console", stream=sys.__stderr__)
    node = f"n-forge-{uuid.uuid4().hex[:6]}"
    host = Path(tempfile.mkdtemp(prefix="hf-", dir="/tmp"))
    kubelet = await kubelet_factory(node)
    backend = FakeBackend(
        BackendSettings(
            split_count=4,
            options={
                "devices": [{"count": 2, "model": "NVIDIA-Test", "memory": 32768}],
                "uuid_prefix": f"GPU-{node}",
                "hamicore": {"containers_dir": str(host / "containers")},
            },
        )
    )
    agent = NodeAgent(
        Config(),
        node_name=node,
        kubeconfig=str(controlplane.kubeconfig),
        backends={"fake": backend},
        register_period=0.5,
        device_plugin_dir=str(kubelet.plugin_dir),
        serve_http=False,
        kubelet_poll=0.2,
    )
    task = asyncio.create_task(agent.run())
    try:
        await agent.wait_ready(30)
        await kubelet.wait_for_resource(RESOURCE, healthy=8)
        forged = {
            "all": ("all,NVIDIA,1000,0:;", "'all' is not a device uuid"),
            "huge": (f"GPU-{node}-0,NVIDIA,999999,0:;", "memory 999999 MiB"),
            "foreign": ("GPU-other-node-0,NVIDIA,1000,0:;", "GPU-other-node-0 is not a nvidia"),
        }
        for name, (value, cause) in forged.items():
            await forge(kube, namespace, node, name, value)
            admission = await kubelet.wait_for_admission(namespace, name, timeout=30)
            assert admission.phase == "Failed", name
            assert f"pod {namespace}/{name}" in str(admission.message)
            assert cause in str(admission.message)
            assert not admission.containers  # nothing reached a container
            pod = await kube.get_pod(namespace, name)
            assert pod["metadata"]["annotations"][keys.BIND_PHASE] == "failed"
        await forge(kube, namespace, node, "fine", f"GPU-{node}-1,NVIDIA,1000,0:;")
        admission = await kubelet.wait_for_admission(namespace, "fine", timeout=30)
        assert admission.phase == "Running", admission.message
        assert admission.envs["c0"]["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{node}-1"
    finally:
        await agent.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        shutil.rmtree(host, ignore_errors=True)
