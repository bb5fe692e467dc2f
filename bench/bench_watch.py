"""Time the scheduler's watch handling: decoding watch lines, the reflector, on_pod/on_node.

    .venv/bin/python bench/bench_watch.py          # 20,000 events; 1,000 and 65,000 nodes
    .venv/bin/python bench/bench_watch.py --events 50000 --profile

A burst of watch events as the API server sends them (one JSON object a line), replayed
in process, no network:
- pods: realistic Pod objects (managedFields, status, ~5 KB); 90 % are pods hami has
  nothing to do with (no hami annotations, no device request) whose status changes, 10 %
  GPU pods with hami's annotations (bound, running) whose status changes;
- nodes: Node objects with hami's register and handshake annotations whose status
  (heartbeat) changes.

Figures per stage, each as events/s and µs per event:
- ``decode``: ``hami.kube.client._json_lines`` over the byte stream in 64 KiB chunks;
- ``reflector``: ``Reflector._on_event`` into the handler (bookkeeping + handler);
- ``on_pod``/``on_node``: the scheduler's handler alone, on decoded objects;
- ``total``: decode + reflector + handler, what one watch event costs the event loop.

Times are CPU seconds of this process, the best of ``--repeat`` runs, so a busy machine
skews them less. ``--profile`` prints the top functions of the total by cumulative time.
Each ``--nodes`` size is a cluster of its own (the same events spread over more nodes); a
size the machine's memory cannot hold is skipped with a printed reason.
A benchmark, not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from _memory import room_for

from hami import config, log
from hami.backends.nvidia_names import NVIDIA_ALLOCATED, NVIDIA_RESOURCES, NVIDIA_TO_ALLOCATE
from hami.core.requests import DeviceKind
from hami.kube import client as kube_client
from hami.kube.reflector import Reflector
from hami.protocol import ContainerDevice, encode_pod_devices
from hami.scheduler.service import Scheduler

KIND = DeviceKind("nvidia", "NVIDIA", NVIDIA_RESOURCES, NVIDIA_ALLOCATED, NVIDIA_TO_ALLOCATE)
CHUNK = 64 * 1024
Work = Callable[[], Awaitable[None]]
NOW_STAMP = "Reported_2024-05-20 10:00:00"
# the scheduler's state for nodes holding few pods, and the replayed events
MIB_PER_1000_NODES = 15


def managed_fields(manager: str) -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2024-05-20T10:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}}},
            "f:spec": {
                "f:containers": {'k:{"name":"main"}': {".": {}, "f:image": {}, "f:name": {}}},
                "f:dnsPolicy": {},
                "f:restartPolicy": {},
            },
            "f:status": {"f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}}}},
        },
    }


def pod(i: int, node: str, rv: int, gpu: bool) -> dict[str, Any]:
    name = f"app-{i:06d}"
    limits: dict[str, str] = {"cpu": "1", "memory": "1Gi"}
    annotations: dict[str, str] = {"kubectl.kubernetes.io/restartedAt": "2024-05-20T10:00:00Z"}
    if gpu:
        limits |= {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}
        entry = [[ContainerDevice(f"GPU-{node}-{i % 8}", "NVIDIA", 4000, 0)]]
        annotations |= {
            "hami.io/vgpu-node": node,
            "hami.io/vgpu-time": "1716199200",
            "hami.io/vgpu-devices-allocated": encode_pod_devices(entry),
            "hami.io/vgpu-devices-to-allocate": ";",
            "hami.io/bind-phase": "success",
            "hami.io/bind-time": "1716199200",
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": f"team-{i % 20}",
            "uid": f"00000000-0000-0000-0000-{i:012d}",
            "resourceVersion": str(rv),
            "creationTimestamp": "2024-05-20T10:00:00Z",
            "labels": {"app": f"app-{i % 50}", "pod-template-hash": "5d8f7c9b6"},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"app-{i % 50}-5d8f7c9b6",
                    "uid": "11111111-2222-3333-4444-555555555555",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [managed_fields("kube-controller-manager"), managed_fields("kubelet")],
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "hami-scheduler" if gpu else "default-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/app:1.2.3",
                    "env": [{"name": f"VAR_{k}", "value": f"value-{k}"} for k in range(8)],
                    "resources": {"limits": limits, "requests": dict(limits)},
                    "volumeMounts": [
                        {
                            "name": "kube-api-access",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        }
                    ],
                }
            ],
            "tolerations": [
                {"key": k, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                for k in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
            ],
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "podIP": f"10.1.{i // 250 % 250}.{i % 250}",
            "startTime": "2024-05-20T10:00:00Z",
            "conditions": [
                {
                    "type": t,
                    "status": "True",
                    "lastTransitionTime": f"2024-05-20T10:{rv % 60:02d}:00Z",
                }
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": rv % 7,
                    "image": "registry.example/app:1.2.3",
                    "imageID": "registry.example/app@sha256:" + "ab" * 32,
                    "containerID": "containerd://" + "cd" * 32,
                    "started": True,
                    "state": {"running": {"startedAt": "2024-05-20T10:00:00Z"}},
                }
            ],
        },
    }


def node(n: int, rv: int) -> dict[str, Any]:
    name = f"node-{n:05d}"
    register = "".join(
        f"GPU-{name}-{d},10,40960,100,NVIDIA-A100-SXM4-40GB,{d // 4},true:" for d in range(8)
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"node-uid-{n}",
            "resourceVersion": str(rv),
            "labels": {"kubernetes.io/hostname": name, "gpu": "on"},
            "annotations": {
                "hami.io/node-nvidia-register": register,
                "hami.io/node-handshake-nvidia": NOW_STAMP,
                "node.alpha.kubernetes.io/ttl": "0",
            },
            "managedFields": [managed_fields("kubelet")],
        },
        "spec": {"podCIDR": f"10.1.{n % 250}.0/24"},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "80"},
            "allocatable": {"cpu": "63", "memory": "500Gi", "nvidia.com/gpu": "80"},
            "conditions": [
                {
                    "type": t,
                    "status": "False" if t != "Ready" else "True",
                    "lastHeartbeatTime": f"2024-05-20T10:{rv % 60:02d}:00Z",
                }
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],
            "nodeInfo": {"kubeletVersion": "v1.30.0", "containerRuntimeVersion": "containerd"},
        },
    }


class _Content:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def iter_any(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self.data), CHUNK):
            yield self.data[start : start + CHUNK]


class _Response:
    def __init__(self, data: bytes) -> None:
        self.content = _Content(data)


def stream(kind: str, objects: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps({"type": kind, "object": o}).encode() + b"\n" for o in objects)


async def decode_all(data: bytes) -> int:
    count = 0  # nothing kept: a watch does not keep the decoded events either
    async for _event in kube_client._json_lines(_Response(data)):  # type: ignore[arg-type]
        count += 1
    return count


def scheduler() -> Scheduler:
    cfg = config.from_mapping({}, env={})
    sched = Scheduler(cfg.scheduler, [KIND], None, emit_events=False)
    sched.nodes_synced.set()
    sched.pods_synced.set()
    return sched


def reflector(handler: Callable[[str, dict[str, Any]], None], name: str) -> Reflector:
    return Reflector(None, f"/api/v1/{name}", handler, name=name)  # type: ignore[arg-type]


def rate(label: str, events: int, seconds: float) -> str:
    return f"{label:10s} {events / seconds:11,.0f} events/s  {seconds / events * 1e6:8.1f} µs/event"


async def best(work: Callable[[], Awaitable[Any]], repeat: int) -> float:
    """The least CPU seconds of ``repeat`` runs (CPU time: the machine may be shared)."""
    times: list[float] = []
    for _ in range(repeat):
        gc.collect()
        began = time.process_time()
        await work()
        times.append(time.process_time() - began)
    return min(times)


def events_of(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "MODIFIED", "object": o} for o in objects]


def replay(handler: Callable[[str, dict[str, Any]], None], objects: list[dict[str, Any]]) -> Work:
    async def work() -> None:
        for obj in objects:
            handler("MODIFIED", obj)

    return work


async def run(args: argparse.Namespace, nodes: int) -> None:
    events, repeat = args.events, args.repeat
    rng = random.Random(args.seed)
    node_names = [f"node-{n:05d}" for n in range(nodes)]
    pods_n = max(1, events // 4)  # each pod changes about four times in the burst
    gpu = [rng.random() < args.gpu_share for _ in range(pods_n)]
    sched = scheduler()
    for n in range(nodes):
        sched.on_node("ADDED", node(n, 1))
    for i in range(pods_n):
        sched.on_pod("ADDED", pod(i, node_names[i % nodes], 1, gpu[i]))
    pod_objects = [
        pod(i, node_names[i % nodes], 2 + k, gpu[i])
        for k, i in enumerate(rng.randrange(pods_n) for _ in range(events))
    ]
    node_objects = [node(rng.randrange(nodes), 2 + k) for k in range(max(1, events // 10))]
    pod_bytes = stream("MODIFIED", pod_objects)
    node_bytes = stream("MODIFIED", node_objects)
    print(
        f"{events} pod events ({sum(gpu) / pods_n:.0%} of {pods_n} pods hold devices), "
        f"{len(node_objects)} node events, {nodes} nodes; "
        f"{len(pod_bytes) / events / 1024:.1f} KiB per pod event; "
        f"CPU time, best of {repeat}; load {os.getloadavg()[0]:.1f}"
    )

    async def decode() -> None:
        await decode_all(pod_bytes)

    print(rate("decode", events, await best(decode, repeat)))
    decoded = events_of(pod_objects)
    pods_reflector = reflector(sched.on_pod, "pods")

    async def reflect() -> None:
        for event in decoded:
            pods_reflector._on_event(event)

    print(rate("reflector", events, await best(reflect, repeat)))
    print(rate("on_pod", events, await best(replay(sched.on_pod, pod_objects), repeat)))
    plain = [o for o in pod_objects if "hami.io/vgpu-node" not in o["metadata"]["annotations"]]
    held = [o for o in pod_objects if "hami.io/vgpu-node" in o["metadata"]["annotations"]]
    if plain:
        print(rate("  plain", len(plain), await best(replay(sched.on_pod, plain), repeat)))
    if held:
        print(rate("  hami", len(held), await best(replay(sched.on_pod, held), repeat)))
    print(
        rate("on_node", len(node_objects), await best(replay(sched.on_node, node_objects), repeat))
    )
    nodes_reflector = reflector(sched.on_node, "nodes")

    async def total() -> None:
        async for event in kube_client._json_lines(_Response(pod_bytes)):  # type: ignore[arg-type]
            pods_reflector._on_event(event)
        async for event in kube_client._json_lines(_Response(node_bytes)):  # type: ignore[arg-type]
            nodes_reflector._on_event(event)

    print(rate("total", events + len(node_objects), await best(total, repeat)))
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        await total()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--nodes", type=int, nargs="*", default=[1_000, 65_000])
    parser.add_argument("--gpu-share", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    log.configure(level="warning")
    for nodes in args.nodes:
        if room_for(nodes, MIB_PER_1000_NODES, "bench_watch"):
            asyncio.run(run(args, nodes))


if __name__ == "__main__":
    main()
