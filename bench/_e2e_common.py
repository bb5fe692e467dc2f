"""What bench_e2e.py and bench_dra.py share: the simulated nodes and their pods, the pod
watch that times binds (and stands in for the node agent), and the printing helpers (the
one-node parts: ``_one_node``). Neither benchmark imports the other's module for these, so
bench/ has no import circle (tests/test_bench_imports.py); no ``__main__``: ``make bench``
skips it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from hami.kube.client import Kube, pods_path
from hami.kube.raw import KubeError
from hami.protocol import handshake, keys

LABEL = "hami.io/bench-e2e"
HAMI_NAME = "hami-scheduler"
ALONE_NAME = "bench-alone"
GPU_MODEL, GPU_MEMORY, GPUS, SPLIT = "NVIDIA-A100-SXM4-40GB", 40960, 8, 10


def load() -> str:
    one, five, _fifteen = os.getloadavg()
    return f"load {one:.2f} / {five:.2f} (1 / 5 min, {os.cpu_count()} cpus)"


def say(text: str) -> None:
    print(text, flush=True)


def register_value(node: str) -> str:
    return "".join(
        f"GPU-{node}-{d},{SPLIT},{GPU_MEMORY},100,{GPU_MODEL},{d // 4},true:" for d in range(GPUS)
    )


async def create_nodes(kube: Kube, run: str, count: int) -> list[str]:
    names = [f"e2e-{run}-{i:04d}" for i in range(count)]
    stamp = handshake.reported(handshake_now())
    resources = {"cpu": "64", "memory": "256Gi", "pods": "1000", "nvidia.com/gpu": "80"}
    gate = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        async with gate:
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {LABEL: run, "kubernetes.io/hostname": name},
                    "annotations": {
                        keys.node_register("nvidia"): register_value(name),
                        "hami.io/node-handshake-nvidia": stamp,
                    },
                },
            }
            await kube.create("/api/v1/nodes", body)
            status = {
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Bench"}],
                }
            }
            await kube.merge_patch(f"/api/v1/nodes/{name}/status", status)
            # the API server taints a new Node not-ready; a kubelet lifts it once Ready
            await kube.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

    await asyncio.gather(*(one(n) for n in names))
    return names


def handshake_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def bench_pod(name: str, run: str, hami: bool, policy: str) -> dict[str, Any]:
    if hami:
        container = {
            "name": "c",
            "image": "bench",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}},
        }
        annotations = {keys.NODE_SCHEDULER_POLICY: policy}
    else:
        container = {"name": "c", "image": "bench", "resources": {"requests": {"cpu": "100m"}}}
        annotations = {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "schedulerName": HAMI_NAME if hami else ALONE_NAME,
            "nodeSelector": {LABEL: run},
            "containers": [container],
            "terminationGracePeriodSeconds": 0,
        },
    }


class PodWatch:
    """Bind times of the round's pods, and the stand-in node agent for hami's binds."""

    def __init__(self, kube: Kube, namespace: str, agent: bool) -> None:
        self.kube = kube
        self.namespace = namespace
        self.agent = agent
        self.bound: dict[str, float] = {}
        self.released: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.changed = asyncio.Event()

    async def run(self, version: str) -> None:
        query = [("watch", "1"), ("resourceVersion", version), ("allowWatchBookmarks", "false")]
        while True:
            try:
                async with self.kube.stream(pods_path(self.namespace), query=query) as events:
                    async for event in events:
                        obj = event.get("object") or {}
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        query[1] = ("resourceVersion", version)
                        self.seen(obj)
            except (TimeoutError, KubeError, ValueError, OSError):
                await asyncio.sleep(0.2)

    def seen(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        name = str(meta.get("name"))
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return
        if name not in self.bound:
            self.bound[name] = time.monotonic()
            self.changed.set()
        phase = (meta.get("annotations") or {}).get(keys.BIND_PHASE)
        if self.agent and phase == "allocating" and name not in self.released:
            self.released.add(name)
            task = asyncio.create_task(self.allocate(name, str(node)))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def allocate(self, name: str, node: str) -> None:
        """What the node agent does after the pod's last Allocate."""
        with contextlib.suppress(KubeError):
            await self.kube.patch_pod_annotations(
                self.namespace, name, {keys.BIND_PHASE: "success"}
            )
        with contextlib.suppress(KubeError):
            await self.kube.patch_node_annotations(node, {keys.NODE_LOCK: None})

    async def wait(self, count: int, timeout: float) -> bool:  # noqa: ASYNC109
        deadline = time.monotonic() + timeout
        while len(self.bound) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))
        return True


async def delete_all_pods(kube: Kube, namespace: str) -> None:
    with contextlib.suppress(KubeError):
        await kube.delete(
            pods_path(namespace), body={"gracePeriodSeconds": 0}, query=[("gracePeriodSeconds", 0)]
        )
    for _ in range(300):
        if not await kube.list_pods(namespace=namespace):
            return
        await asyncio.sleep(0.2)
