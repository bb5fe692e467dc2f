"""A real kube-scheduler, configured by config/kube-scheduler.yaml, uses hami as extender."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from _sched_helpers import (
    FakeClock,
    create_pod,
    gpu_pod,
    register,
    running_scheduler,
    unique,
)

from hami.kube.client import Kube
from hami.protocol import keys
from hami.testkit.cluster import poll

CONFIG = Path(__file__).resolve().parent.parent / "config" / "kube-scheduler.yaml"


async def test_kube_scheduler_filters_and_binds_through_hami(
    kube: Kube, namespace: str, kube_scheduler: Any, kubelet_factory: Any
) -> None:
    names = [unique("ks-a"), unique("ks-b")]
    for name in names:
        await kubelet_factory(name)
    # node a has a small GPU, node b a big one: a 20000 MiB pod only fits on b
    for name, memory in zip(names, (8000, 40000), strict=True):
        await kube.patch_node_annotations(
            name,
            {
                "hami.io/node-nvidia-register": register([f"GPU-{name}"], memory=memory),
                "hami.io/node-handshake-nvidia": "Reported_2024-05-20 09:59:50",
            },
        )
    async with running_scheduler(kube, FakeClock()) as role:
        config = yaml.safe_load(CONFIG.read_text())
        config["extenders"][0]["urlPrefix"] = role.url
        await kube_scheduler(config)
        await poll(
            lambda: all(
                n in role.scheduler.cluster.nodes and role.scheduler.cluster.nodes[n].types
                for n in names
            )
        )
        await create_pod(kube, namespace, gpu_pod("big", mem=20000))

        async def bound() -> bool:
            pod = await kube.get_pod(namespace, "big")
            return bool(pod["spec"].get("nodeName"))

        await poll(bound, 30)
        pod = await kube.get_pod(namespace, "big")
        assert pod["spec"]["nodeName"] == names[1]
        ann = pod["metadata"]["annotations"]
        assert ann["hami.io/vgpu-node"] == names[1]
        assert ann["hami.io/vgpu-devices-allocated"] == f"GPU-{names[1]},NVIDIA,20000,0:;"
        assert ann["hami.io/bind-phase"] == "allocating"
        node = await kube.get_node(names[1])
        assert node["metadata"]["annotations"][keys.NODE_LOCK].endswith(f",{namespace},big")
        # too big for every node: stays pending, with hami's reasons in the event
        await create_pod(kube, namespace, gpu_pod("huge", mem=50000))

        async def reported() -> bool:
            pod = await kube.get_pod(namespace, "huge")
            conditions = (pod.get("status") or {}).get("conditions") or []
            return any(c.get("reason") == "Unschedulable" for c in conditions)

        await poll(reported, 30)
        pod = await kube.get_pod(namespace, "huge")
        message = next(
            c["message"] for c in pod["status"]["conditions"] if c.get("reason") == "Unschedulable"
        )
        assert "CardInsufficientMemory" in message
        assert "nodeName" not in pod["spec"]
