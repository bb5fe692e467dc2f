"""Interop, issue 24: Go HAMi v2.10's own scheduler places Ascend pods on a node served by
this project's Ascend agent (docs/interop.md).

Runs only with a Go HAMi source tree (``HAMI_SRC``) or a built scheduler
(``HAMI_GO_SCHEDULER``), like tests/test_interop_go.py; otherwise skipped with one line. The
cluster: the test control plane, kube-scheduler with Go HAMi as its extender (``vnpus`` of
Go's chart for the 910B3, ``--enable-ascend``), and one node whose agent runs the
``Ascend910B3`` backend over a stand-in ``npu-smi`` printing the documented layouts (four
chips), with the kubelet emulator.

What is proven: Go reads the register value and heartbeat this agent writes; it places a vNPU
pod (memory as Go's webhook rounds it to the ``vir05_1c_16g`` template) and a two-chip pod on
the node and binds them under ``hami.io/mutex.lock``; kubelet's Allocate (real device-plugin
gRPC) answers ``ASCEND_VISIBLE_DEVICES`` with the physical ids of the chips Go chose and, for
the vNPU, ``ASCEND_VNPU_SPECS`` from Go's ``huawei.com/Ascend910B3``; the agent releases the
lock. A soft-split pod (``huawei.com/vnpu-mode: hami-core``) is kept off the node by Go
(``ModeNotFit``: the agent writes ``hami-vnpu-core: "false"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _ascend_helpers import b3_node, fake_npu_smi
from _gohami import go_scheduler_binary, go_version, skip_reason
from _gohami_vendor import GoScheduler
from _node_helpers import kubelet_agent

from hami.backends import BackendSettings
from hami.backends.ascend import BACKENDS
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

WORD = "Ascend910B3"
RESOURCES = (f"huawei.com/{WORD}", f"huawei.com/{WORD}-memory", f"huawei.com/{WORD}-core")
TO_ALLOC = f"hami.io/{WORD}-devices-to-allocate"
ALLOCATED = f"hami.io/{WORD}-devices-allocated"

#: Go HAMi's chart's vnpus entry for the 910B3 (charts/hami device ConfigMap), soft split off.
DEVICE_CONFIG = f"""\
vnpus:
  hamiVnpuCore: false
  configs:
  - chipName: 910B3
    commonWord: {WORD}
    resourceName: huawei.com/{WORD}
    resourceMemoryName: huawei.com/{WORD}-memory
    resourceCoreName: huawei.com/{WORD}-core
    memoryAllocatable: 65536
    memoryCapacity: 65536
    memoryFactor: 1
    aiCore: 20
    aiCPU: 7
    templates:
      - name: vir05_1c_16g
        memory: 16384
        aiCore: 5
        aiCPU: 1
      - name: vir10_3c_32g
        memory: 32768
        aiCore: 10
        aiCPU: 3
"""


@pytest.fixture(scope="module")
def go_binary() -> Path:
    binary, why = go_scheduler_binary()
    if binary is None:
        pytest.skip(why)
    if sys.__stderr__ is not None:  # past pytest's capture: which Go binary ran
        sys.__stderr__.write(f"\nGo HAMi scheduler: {binary} ({go_version(binary)})\n")
    return binary


def npu_pod(name: str, limits: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    """As Go's webhook leaves it: the memory in limits and requests."""
    requests = {k: v for k, v in limits.items() if k.endswith("-memory")}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"limits": limits, "requests": requests},
                }
            ],
        },
    }


async def wait_phase(kube: Kube, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:  # noqa: ASYNC109
    async with asyncio.timeout(timeout):
        while True:
            pod = await kube.get_pod(namespace, name)
            if (pod.get("status") or {}).get("phase") in ("Running", "Failed"):
                return pod
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def ascend_agent(kube: Kube, kubelet: Any, node: str, tmp: Path) -> AsyncIterator[Any]:
    chips = b3_node(4, seed=0x3D)
    script, dev = fake_npu_smi(tmp, chips)
    backend = BACKENDS[WORD](BackendSettings(options={"npu_smi": str(script), "dev_dir": str(dev)}))
    async with kubelet_agent(kube, kubelet, node, WORD, backend):
        await kubelet.wait_for_resource(f"huawei.com/{WORD}", healthy=4 * 4)
        yield chips


async def test_go_places_ascend_pods_on_this_agent(
    controlplane: ControlPlane,
    go_binary: Path,
    kubelet_factory: Any,
    kube_scheduler: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    node = f"go-npu-{uuid.uuid4().hex[:6]}"
    async with GoScheduler(go_binary, controlplane, DEVICE_CONFIG, ["--enable-ascend"]) as go:
        await kube_scheduler(go.kube_scheduler_config(RESOURCES))
        kubelet = await kubelet_factory(node)
        async with ascend_agent(kube, kubelet, node, tmp_path) as chips:
            phys = {c.uuid: str(c.phy) for c in chips}
            pods = {
                # 3000 MiB, rounded by Go's webhook to the smallest template holding it
                "vnpu": {f"huawei.com/{WORD}": "1", f"huawei.com/{WORD}-memory": "16384"},
                # two whole chips: the webhook writes the chip's memory
                "whole": {f"huawei.com/{WORD}": "2", f"huawei.com/{WORD}-memory": "65536"},
            }
            for name, limits in pods.items():
                await kube.create(f"/api/v1/namespaces/{namespace}/pods", npu_pod(name, limits, {}))
            taken: list[str] = []
            for name in pods:
                try:
                    pod = await wait_phase(kube, namespace, name)
                except TimeoutError:
                    raise AssertionError(f"{name} not started; {go.diagnosis()}") from None
                assert pod["status"]["phase"] == "Running", (pod["status"], go.diagnosis())
                assert pod["spec"]["nodeName"] == node
                annotations = pod["metadata"]["annotations"]
                assert annotations[keys.BIND_PHASE] == "success"
                assert annotations[TO_ALLOC] == ";"  # the agent consumed Go's entry
                # Go's decision, as Go wrote it
                (entry,) = [e for e in decode_pod_devices(annotations[ALLOCATED]) if e]
                assert all(d.vendor == WORD and d.uuid in phys for d in entry)
                runtime = json.loads(annotations[f"huawei.com/{WORD}"])
                assert [r["UUID"] for r in runtime] == [d.uuid for d in entry]
                env = (await kubelet.wait_for_admission(namespace, name)).envs["c"]
                visible = ",".join(phys[d.uuid] for d in entry)
                if name == "vnpu":
                    assert [(d.memory, r["temp"]) for d, r in zip(entry, runtime, strict=True)] == [
                        (16384, "vir05_1c_16g")
                    ]
                    assert env == {
                        "ASCEND_VISIBLE_DEVICES": visible,
                        "ASCEND_VNPU_SPECS": "vir05_1c_16g",
                    }
                else:
                    assert len(entry) == 2 and all("temp" not in r for r in runtime)
                    assert [d.memory for d in entry] == [65536, 65536]
                    assert env == {"ASCEND_VISIBLE_DEVICES": visible}
                taken += [d.uuid for d in entry]
            # three chips taken, none twice (the vNPU's chip is not one of the whole ones)
            assert len(set(taken)) == 3, taken
            obj = await kube.get_node(node)
            assert keys.NODE_LOCK not in (obj["metadata"].get("annotations") or {})

            # HAMi's soft split: Go keeps the pod off a node that offers none
            soft = npu_pod(
                "soft",
                {f"huawei.com/{WORD}": "1", f"huawei.com/{WORD}-memory": "4096"},
                {"huawei.com/vnpu-mode": "hami-core"},
            )
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", soft)
            await go.wait_log("FilteringFailed", "ModeNotFit", node)
            pod = await kube.get_pod(namespace, "soft")
            assert not pod["spec"].get("nodeName"), pod["spec"]
