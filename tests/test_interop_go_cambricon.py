"""Interop, issue 24: Go HAMi v2.10's own scheduler places Cambricon pods on a node served by
this project's MLU agent (docs/interop.md).

Runs only with a Go HAMi source tree (``HAMI_SRC``) or a built scheduler
(``HAMI_GO_SCHEDULER``), like tests/test_interop_go.py; otherwise skipped with one line. The
cluster: the test control plane, kube-scheduler with Go HAMi as its extender (the
``cambricon`` section of Go's chart), and one node whose agent runs the ``mlu`` backend over
a stand-in ``cnmon`` (two MLU370-X4 of 23308 MiB), with the kubelet emulator.

What is proven: Go finds the two cards in the ``mlu.smlu.vcore`` and ``mlu.smlu.vmemory``
capacities the agent advertises and names them ``{node}-cambricon-mlu-{i}``; it places a
memory-share pod and a whole-card pod, binding each under ``cambricon.com/dsmlu.lock``;
kubelet's Allocate (real device-plugin gRPC) answers each with the environment Cambricon's
runtime reads for the card Go chose (``CAMBRICON_SPLIT_*``: slot, memory, split only for the
share); the agent removes the lock after each allocation, so the second pod, created with
the first, starts within seconds and no lock is left on the node. (Without the removal the
second pod is not held for Go's two minutes either: a bind Go refuses for the lock removes
it, scheduler.go ``Bind`` -> ``releaseAllDevices`` -> Cambricon's ``ReleaseNodeLock``; the
lock of the last bind then stays, which the last assertion catches.)
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _cambricon_helpers import X4_0, X4_1, fake_cnmon
from _cambricon_helpers import backend as mlu_backend
from _gohami import go_scheduler_binary, go_version, skip_reason
from _gohami_vendor import GoScheduler
from _node_helpers import kubelet_agent

from hami.backends.cambricon_go import NODE_LOCK, PROFILE, card_id
from hami.kube.client import Kube
from hami.protocol import decode_pod_devices, keys
from hami.testkit.cluster import SCHEDULER_NAME
from hami.testkit.controlplane import ControlPlane

_why = skip_reason()
pytestmark = [
    pytest.mark.skipif(_why is not None, reason=_why or ""),
    pytest.mark.controlplane,
    pytest.mark.timeout(1800),  # the first test may build Go HAMi's scheduler
]

COUNT, VMEM, VCORE = (
    "cambricon.com/vmlu",
    "cambricon.com/mlu.smlu.vmemory",
    "cambricon.com/mlu.smlu.vcore",
)
TO_ALLOC = "hami.io/cambricon-mlu-devices-to-allocate"
ALLOCATED = "hami.io/cambricon-mlu-devices-allocated"
#: Go HAMi's chart's cambricon section.
DEVICE_CONFIG = f"""\
cambricon:
  resourceCountName: {COUNT}
  resourceMemoryName: {VMEM}
  resourceCoreName: {VCORE}
"""
SLOTS = {X4_0: "0", X4_1: "1"}  # the stand-in cnmon's cards
WHOLE_MIB = 91 * 256  # an MLU370-X4's 23308 MiB in whole vmemory units: Go's 100 % of it


@pytest.fixture(scope="module")
def go_binary() -> Path:
    binary, why = go_scheduler_binary()
    if binary is None:
        pytest.skip(why)
    if sys.__stderr__ is not None:  # past pytest's capture: which Go binary ran
        sys.__stderr__.write(f"\nGo HAMi scheduler: {binary} ({go_version(binary)})\n")
    return binary


def mlu_pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


async def wait_phase(kube: Kube, namespace: str, name: str, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
    async with asyncio.timeout(timeout):
        while True:
            pod = await kube.get_pod(namespace, name)
            if (pod.get("status") or {}).get("phase") in ("Running", "Failed"):
                return pod
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def mlu_agent(kube: Kube, kubelet: Any, node: str, tmp: Path) -> AsyncIterator[None]:
    backend = mlu_backend(fake_cnmon(tmp, "file"), host_root=str(tmp))
    async with kubelet_agent(kube, kubelet, node, "mlu", backend):
        await kubelet.wait_for_resource(VCORE, healthy=200)
        await kubelet.wait_for_resource(VMEM, healthy=182)
        yield


async def test_go_places_cambricon_pods_on_this_agent(
    controlplane: ControlPlane,
    go_binary: Path,
    kubelet_factory: Any,
    kube_scheduler: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    node = f"go-mlu-{uuid.uuid4().hex[:6]}"
    async with GoScheduler(go_binary, controlplane, DEVICE_CONFIG) as go:
        await kube_scheduler(go.kube_scheduler_config((COUNT, VMEM, VCORE)))
        kubelet = await kubelet_factory(node)
        async with mlu_agent(kube, kubelet, node, tmp_path):
            # a share: 16 vmemory units (4096 MiB) and half the cores; then a whole card
            pods = {
                "share": {COUNT: "1", VMEM: "16", VCORE: "50"},
                "whole": {COUNT: "1"},
            }
            began = time.monotonic()
            for name, limits in pods.items():
                await kube.create(f"/api/v1/namespaces/{namespace}/pods", mlu_pod(name, limits))
            slots: dict[str, str] = {}
            for name in pods:
                try:
                    # well below the two minutes a lock nobody removes would hold the second
                    pod = await wait_phase(kube, namespace, name, timeout=75)
                except TimeoutError:
                    raise AssertionError(f"{name} not started; {go.diagnosis()}") from None
                assert pod["status"]["phase"] == "Running", (pod["status"], go.diagnosis())
                assert pod["spec"]["nodeName"] == node
                annotations = pod["metadata"]["annotations"]
                assert annotations[keys.BIND_PHASE] == "success"
                assert annotations[TO_ALLOC] == ";"  # the agent consumed Go's entry
                # Go's decision names a card it read from capacity
                ((device,),) = [e for e in decode_pod_devices(annotations[ALLOCATED]) if e]
                card = int(device.uuid.rsplit("-", 1)[1])
                assert device.uuid == card_id(node, card) and device.vendor == "MLU"
                env = (await kubelet.wait_for_admission(namespace, name)).envs["c"]
                slot = env["CAMBRICON_SPLIT_VISIBLE_DEVICES"]
                assert slot == list(SLOTS.values())[card]  # card i is the i-th card by index
                slots[name] = slot
                if name == "share":
                    assert (device.memory, device.cores) == (4096, 50)
                    assert annotations[PROFILE] == f"{card}_50_16"
                    assert env == {
                        "CAMBRICON_SPLIT_ENABLE": "1",
                        "CAMBRICON_SPLIT_VISIBLE_DEVICES": slot,
                        "CAMBRICON_SPLIT_MEMS": "4096",
                    }
                else:
                    assert (device.memory, device.cores) == (WHOLE_MIB, 100)
                    assert env == {
                        "CAMBRICON_SPLIT_VISIBLE_DEVICES": slot,
                        "CAMBRICON_SPLIT_MEMS": str(WHOLE_MIB),
                    }
            elapsed = time.monotonic() - began
            # the whole card is the one the share left free (Go: exclusive needs an idle card)
            assert slots["share"] != slots["whole"], slots
            assert elapsed < 100, f"the second pod waited {elapsed:.0f}s: was the lock kept?"
            obj = await kube.get_node(node)
            assert NODE_LOCK not in (obj["metadata"].get("annotations") or {})
            # Go took the lock for both binds (its log says so), the agent removed it each time
            log = go.log_text()
            assert log.count("Node lock set") >= 2, go.diagnosis()
