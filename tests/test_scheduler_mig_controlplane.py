"""MIG reservation on the real control plane (issue 23 items 2 and 7): a MIG GPU registered
through the node annotation takes mixed-profile pods through /filter and /bind until it is
full; the reservations the pods carry never make an illegal layout, the full GPU is
explained in MIG terms, and a restarted scheduler reads the same occupancy back."""

from __future__ import annotations

import contextlib
from typing import Any

from _data import data_json
from _sched_helpers import (
    FakeClock,
    binding,
    create_node,
    create_pod,
    delete_nodes,
    gpu_pod,
    post,
    running_scheduler,
    unique,
)

from hami.kube.client import Kube
from hami.kube.raw import Conflict, KubeError
from hami.protocol import decode_pod_devices, keys
from hami.protocol.mig import MigPlacement, MigProfile, decode_mig_allocations, placements_overlap
from hami.protocol.register import NodeDevice, encode_node_devices_json
from hami.testkit.cluster import poll

REPORTED = "Reported_2024-05-20 09:59:50"
MIG_ON = {"nvidia.com/vgpu-mode": "mig"}
# MiB asked in turn (3g, 2g, 1g, 1g, 2g, 1g, ...); the A100 40GB profiles of the Go vectors
ASKS = [19000, 9000, 4000, 4000, 9000, 4000, 19000, 4000, 4000]


def _a100_40() -> tuple[MigProfile, ...]:
    case = next(
        c for c in data_json("hami-go-v2.10-mig.json")["select"] if c["name"] == "a100-40-mixed"
    )
    return tuple(
        MigProfile(
            p["name"],
            p["memoryMB"],
            p["core"],
            p["sliceCount"],
            tuple(MigPlacement(x["start"], x["size"]) for x in p["placements"]),
        )
        for p in case["profiles"]
    )


async def _bind_done(kube: Kube, namespace: str, node: str, name: str) -> None:
    """What the node agent does after a pod's Allocate: phase success, lock removed."""
    await kube.patch_pod_annotations(namespace, name, {keys.BIND_PHASE: "success"})
    meta = (await kube.get_node(node))["metadata"]
    with contextlib.suppress(Conflict):
        await kube.patch_node_annotations(
            node, {keys.NODE_LOCK: None}, resource_version=meta["resourceVersion"]
        )


async def test_mixed_profiles_fill_a_mig_gpu_without_an_illegal_layout(
    kube: Kube, namespace: str
) -> None:
    fake = FakeClock()
    node = unique("mig")
    profiles = _a100_40()
    legal = {(p.name, pl) for p in profiles for pl in p.placements}
    register = encode_node_devices_json(
        [
            NodeDevice(
                f"GPU-{node}", 7, 40960, 100, "NVIDIA-A100-SXM4-40GB", 0, True, 0, "mig", profiles
            )
        ]
    )
    await create_node(
        kube,
        node,
        {"hami.io/node-nvidia-register": register, "hami.io/node-handshake-nvidia": REPORTED},
    )
    placed: list[str] = []
    try:
        async with running_scheduler(kube, fake) as role:
            await poll(lambda: node in role.scheduler.cluster.nodes)
            refused: dict[str, Any] = {}
            for i, ask in enumerate(ASKS):
                name = f"m{i}"
                pod = await create_pod(kube, namespace, gpu_pod(name, mem=ask, annotations=MIG_ON))
                answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [node]})
                if not answer["NodeNames"]:
                    refused[name] = answer["FailedNodes"][node]
                    continue
                fake.advance(1)
                assert await post(f"{role.url}/bind", binding(pod, node)) == {"Error": ""}
                await _bind_done(kube, namespace, node, name)
                placed.append(name)
            # 3g + 2g + 1g + 1g fill the 8 memory slices; every later ask is refused in MIG terms
            assert placed == ["m0", "m1", "m2", "m3"]
            assert refused["m4"] == (
                "1/1 CardMigTopologyInfeasible (no 2g.10gb or larger placement free on GPU 0)"
            )
            assert set(refused) == {f"m{i}" for i in range(4, len(ASKS))}
        layout = []
        for name in placed:
            stored = await kube.get_pod(namespace, name)
            annotations = stored["metadata"]["annotations"]
            (allocation,) = decode_mig_allocations(annotations[keys.MIG_ALLOCATIONS])
            assert allocation.gpu_uuid == f"GPU-{node}"
            assert (allocation.profile, allocation.placement) in legal
            # the devices value carries the profile's memory and cores
            profile = next(p for p in profiles if p.name == allocation.profile)
            ((device,),) = decode_pod_devices(annotations["hami.io/vgpu-devices-allocated"])
            assert (device.memory, device.cores) == (profile.memory_mb, profile.core)
            layout.append(allocation.placement)
        for i, a in enumerate(layout):
            assert all(not placements_overlap(a, b) for b in layout[i + 1 :])
        assert sum(p.size for p in layout) == 8
        # a scheduler started afresh reads the reservations back from the pods
        async with running_scheduler(kube, fake) as role:
            await poll(lambda: len(role.scheduler.cluster.pods) == len(placed))
            pod = await create_pod(kube, namespace, gpu_pod("late", mem=1, annotations=MIG_ON))
            answer = await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": [node]})
            assert answer["NodeNames"] == []
            assert "CardMigTopologyInfeasible" in answer["FailedNodes"][node]
            # one pod goes: its slices are free again, for the same profile
            await kube.request(
                "DELETE", f"/api/v1/namespaces/{namespace}/pods/m1?gracePeriodSeconds=0"
            )
            await poll(lambda: len(role.scheduler.cluster.pods) == len(placed) - 1)
            again = await create_pod(
                kube, namespace, gpu_pod("again", mem=9000, annotations=MIG_ON)
            )
            answer = await post(f"{role.url}/filter", {"Pod": again, "NodeNames": [node]})
            assert answer["NodeNames"] == [node]
    finally:
        with contextlib.suppress(KubeError):
            await delete_nodes(kube, [node])
