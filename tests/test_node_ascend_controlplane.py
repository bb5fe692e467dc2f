"""Issue 24 item 3 on the real control plane: kube-scheduler with this scheduler as its
extender places Ascend pods on a node served by this project's node agent, whose chips come
from a stand-in ``npu-smi`` printing the documented layouts, and the kubelet emulator
starts them with the environment Ascend Docker Runtime reads."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from _ascend_helpers import b3_node, fake_npu_smi
from _node_helpers import kubelet_agent

from hami import config
from hami.backends import BackendSettings
from hami.backends.ascend import BACKENDS
from hami.kube.client import Kube
from hami.protocol import keys
from hami.scheduler.role import SchedulerRole

WORD = "Ascend910B3"
RESOURCES = (f"huawei.com/{WORD}", f"huawei.com/{WORD}-memory", f"huawei.com/{WORD}-core")


async def wait_running(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    async with asyncio.timeout(30):
        while True:
            pod = await kube.get_pod(namespace, name)
            if (pod.get("status") or {}).get("phase") in ("Running", "Failed"):
                return pod
            await asyncio.sleep(0.1)


def npu_pod(name: str, limits: dict[str, str], scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


async def test_ascend_pods_start_on_an_npu_smi_node(
    kubelet_factory: Any, kube_scheduler: Any, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    cfg = config.from_mapping(
        {
            "scheduler": {
                "http": {"address": "127.0.0.1", "port": 0},
                "extender": {"address": "127.0.0.1", "port": 0},
                "webhook": {"enabled": False},
                "handshake_period": "1s",
            },
            "backends": {"nvidia": {"enabled": False}, WORD: {"enabled": True}},
        },
        env={},
    )
    chips = b3_node(4, seed=0x2C)
    script, dev = fake_npu_smi(tmp_path, chips)
    node = f"npu-{uuid.uuid4().hex[:6]}"
    async with SchedulerRole(cfg, kube) as role:
        await role.wait_ready()
        await kube_scheduler(
            {
                "profiles": [{"schedulerName": cfg.scheduler.scheduler_name}],
                "extenders": [
                    {
                        "urlPrefix": role.url,
                        "filterVerb": "filter",
                        "bindVerb": "bind",
                        "nodeCacheCapable": True,
                        "weight": 1,
                        "managedResources": [
                            {"name": r, "ignoredByScheduler": True} for r in RESOURCES
                        ],
                    }
                ],
            }
        )
        kubelet = await kubelet_factory(node)
        backend = BACKENDS[WORD](
            BackendSettings(options={"npu_smi": str(script), "dev_dir": str(dev)})
        )
        async with kubelet_agent(kube, kubelet, node, WORD, backend):
            await kubelet.wait_for_resource(f"huawei.com/{WORD}", healthy=4 * 4)
            scheduler = cfg.scheduler.scheduler_name
            # 3000 MiB: the smallest template that holds it, 16 GiB; and two whole chips
            pods = {
                "vnpu": {f"huawei.com/{WORD}": "1", f"huawei.com/{WORD}-memory": "3000"},
                "whole": {f"huawei.com/{WORD}": "2"},
            }
            for name, limits in pods.items():
                await kube.request(
                    "POST",
                    f"/api/v1/namespaces/{namespace}/pods",
                    body=npu_pod(name, limits, scheduler),
                )
            phys = {c.uuid: str(c.phy) for c in chips}
            for name in pods:
                pod = await wait_running(kube, namespace, name)
                assert pod["status"]["phase"] == "Running", pod["status"].get("message")
                assert pod["spec"]["nodeName"] == node
                annotations = pod["metadata"]["annotations"]
                assert annotations[keys.BIND_PHASE] == "success"
                assert annotations[f"hami.io/{WORD}-devices-to-allocate"] == ";"
                runtime = json.loads(annotations[f"huawei.com/{WORD}"])
                env = (await kubelet.wait_for_admission(namespace, name)).envs["c"]
                # the chips the scheduler chose, by the physical ids the runtime mounts
                visible = ",".join(phys[entry["UUID"]] for entry in runtime)
                if name == "vnpu":
                    assert runtime[0]["temp"] == "vir05_1c_16g"
                    assert env == {
                        "ASCEND_VISIBLE_DEVICES": visible,
                        "ASCEND_VNPU_SPECS": "vir05_1c_16g",
                    }
                else:
                    assert len(runtime) == 2 and all("temp" not in e for e in runtime)
                    assert env == {"ASCEND_VISIBLE_DEVICES": visible}
            obj = await kube.get_node(node)
            assert keys.NODE_LOCK not in (obj["metadata"].get("annotations") or {})
