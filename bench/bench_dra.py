"""The DRA mode's parts of bench_e2e (``--only dra dra-one-node``; docs/performance.md "DRA mode").

- ``dra``: the throughput part's nodes (Node objects, no kubelet), each with a ResourceSlice
  of 8 shared devices as a hami agent in ``mode: dra`` publishes them (40960 MiB, 100
  cores, 10 slots each); kube-controller-manager's resourceclaim controller runs. Rounds
  interleave *alone* (kube-scheduler, no extender, pods asking 100m cpu) and *dra*
  (kube-scheduler, no extender, pods whose ResourceClaimTemplate asks one 1000 MiB slice);
  each creates the pods first, then starts kube-scheduler and times the binds a pod watch
  sees (kube-scheduler binds a DRA pod after writing its claim's allocation). Figures:
  pods bound/s and dra/alone; where the time goes, per bound pod: kube-scheduler's CPU
  (its process from start to the last bind, the initial lists included), the
  resourceclaim controller's (kube-controller-manager over the round), kube-apiserver's
  and etcd's, and the API server's write requests by verb and resource. The extender's
  figure for the same nodes and pods is the ``throughput`` part's *hami* (run both:
  ``--only throughput dra``).
- ``dra-one-node``: ``LocalCluster(mode="dra")`` with one node (node agent in ``mode:
  dra``, kubelet emulator preparing claims): one pod alone, then ``--one-node-pods`` (10)
  one-slice pods created at once, timed from watch events (pods and ResourceClaims):
  the marginal cost of each extra pod and its steps (``_one_node``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from typing import Any

import _apiserver as apiserver
from _e2e_common import (
    ALONE_NAME,
    GPU_MEMORY,
    GPU_MODEL,
    GPUS,
    LABEL,
    SPLIT,
    PodWatch,
    bench_pod,
    create_nodes,
    delete_all_pods,
    load,
    say,
)
from _memory import room_for
from _one_node import one_node as marginal_cost

from hami.kube.client import Kube, open_client, pods_path
from hami.kube.raw import KubeError
from hami.testkit.controlplane import ControllerManagerProcess, ControlPlane
from hami.testkit.dra_pods import claim_template, dra_pod, templates_path

DRIVER = "nvidia.hami.io"
DRA_NAME = "bench-dra"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# memory per 1,000 nodes (_memory.room_for): Nodes and ResourceSlices in kube-apiserver and
# etcd, and kube-scheduler's copies of both
MIB_PER_1000_NODES = 200


def slice_body(node: str, run: str) -> dict[str, Any]:
    """What hami.dra.slices publishes for 8 A100s (same capacities and policies)."""
    devices = [
        {
            "name": f"nvidia-{i}",
            "allowMultipleAllocations": True,
            "attributes": {
                "uuid": {"string": f"GPU-{node}-{i}"},
                "model": {"string": GPU_MODEL},
                "index": {"int": i},
            },
            "capacity": {
                "memory": {
                    "value": f"{GPU_MEMORY}Mi",
                    "requestPolicy": {
                        "default": f"{GPU_MEMORY}Mi",
                        "validRange": {"min": "1Mi", "max": f"{GPU_MEMORY}Mi", "step": "1Mi"},
                    },
                },
                "cores": {
                    "value": "100",
                    "requestPolicy": {
                        "default": "0",
                        "validRange": {"min": "0", "max": "100", "step": "1"},
                    },
                },
                "slots": {
                    "value": str(SPLIT),
                    "requestPolicy": {"default": "1", "validValues": ["1"]},
                },
            },
        }
        for i in range(GPUS)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-nvidia-hami-io", "labels": {LABEL: run}},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


async def ensure_device_class(kube: Kube) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    try:
        await kube.create("/apis/resource.k8s.io/v1/deviceclasses", body)
    except KubeError as exc:
        if exc.status != 409:
            raise


def scheduler_config(name: str, qps: int = 0) -> dict[str, Any]:
    data: dict[str, Any] = {"profiles": [{"schedulerName": name}]}
    if qps:
        data["clientConnection"] = {"qps": qps, "burst": 2 * qps}
    return data


async def dra_round(
    plane: ControlPlane,
    kube: Kube,
    run: str,
    pods: int,
    use_dra: bool,
    qps: int = 0,
    kcm: ControllerManagerProcess | None = None,
) -> dict[str, Any]:
    namespace = f"bench-{run}-{uuid.uuid4().hex[:4]}"
    await kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    gate = asyncio.Semaphore(16)
    if use_dra:
        await kube.create(templates_path(namespace), claim_template("slice", mem=1000))

    async def create(i: int) -> None:
        async with gate:
            if use_dra:
                body = dra_pod(
                    f"d-{i:04d}", ["slice"], scheduler_name=DRA_NAME, node_selector={LABEL: run}
                )
            else:
                body = bench_pod(f"a-{i:04d}", run, False, "binpack")
            await kube.create(pods_path(namespace), body)

    await asyncio.gather(*(create(i) for i in range(pods)))
    if use_dra:  # the claims exist before kube-scheduler starts, as the pods do
        for _ in range(600):
            items, _v = await kube.list_all(
                f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
            )
            if len(items) >= pods:
                break
            await asyncio.sleep(0.1)
    _items, version = await kube.list_all(pods_path(namespace))
    watch = PodWatch(kube, namespace, agent=False)
    watcher = asyncio.create_task(watch.run(version))
    name = DRA_NAME if use_dra else ALONE_NAME
    kcm_pid = kcm.process.pid if kcm is not None else None
    kcm_before = apiserver.cpu_seconds(kcm_pid)
    api_before = await asyncio.to_thread(apiserver.snapshot, plane)
    started = time.monotonic()
    sched = await asyncio.to_thread(
        plane.start_scheduler, scheduler_config(name, qps), f"ks-{name}"
    )
    done = await watch.wait(pods, timeout=max(60.0, pods * 0.5))
    sched_cpu = apiserver.cpu_seconds(sched.process.pid)
    kcm_cpu = apiserver.cpu_seconds(kcm_pid) - kcm_before
    api_after = await asyncio.to_thread(apiserver.snapshot, plane)
    await asyncio.to_thread(sched.stop)
    with contextlib.suppress(ValueError):
        plane.schedulers.remove(sched)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    times = sorted(watch.bound.values())
    bound = len(times)
    span = times[-1] - times[0] if bound > 1 else float("nan")
    await delete_all_pods(kube, namespace)
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}")
    per_pod = 1000 / bound if bound else float("nan")
    return {
        "bound": bound,
        "complete": done,
        "rate": (bound - 1) / span if bound > 1 and span > 0 else float("nan"),
        "until_all": (times[-1] - started) if times else float("nan"),
        "scheduler_ms": sched_cpu * per_pod,
        "controller_ms": kcm_cpu * per_pod,
        "api_ms": (api_after.cpu_seconds - api_before.cpu_seconds) * per_pod,
        "writes": apiserver.writes(api_before, api_after),
    }


async def publish_slices(kube: Kube, names: list[str], run: str) -> None:
    gate = asyncio.Semaphore(16)

    async def publish(node: str) -> None:
        async with gate:
            await kube.create(SLICES, slice_body(node, run))

    await asyncio.gather(*(publish(n) for n in names))


async def wait_claims_freed(kube: Kube, timeout: float = 300.0) -> None:  # noqa: ASYNC109
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        items, _v = await kube.list_all("/apis/resource.k8s.io/v1/resourceclaims")
        held = [c for c in items if (c.get("status") or {}).get("allocation")]
        if not held:
            say(f"  claims deallocated {time.monotonic() - began:.1f}s after the last round")
            return
        await asyncio.sleep(1.0)
    say(f"  !! {len(held)} claims still allocated after {timeout:.0f}s")


async def dra_throughput(args: argparse.Namespace, plane: ControlPlane) -> None:
    say(f"\n== DRA throughput: kube-scheduler alone vs DRA claims, no extender ({load()})")
    # from the loop's thread: the parent-death signal follows the thread that starts it
    kcm = plane.start_controller_manager(name="kcm-bench-dra")
    try:
        async with open_client(plane.kubeconfig) as kube:
            await ensure_device_class(kube)
            for count in args.nodes:
                if not room_for(count, MIB_PER_1000_NODES, "DRA throughput"):
                    continue
                run = uuid.uuid4().hex[:6]
                began = time.monotonic()
                names = await create_nodes(kube, run, count)
                await publish_slices(kube, names, run)
                say(
                    f"{count} nodes + ResourceSlices created in {time.monotonic() - began:.1f}s; "
                    f"{args.pods} pods"
                )
                results: dict[str, list[dict[str, Any]]] = {"alone": [], "dra": []}
                for rnd in range(args.rounds):
                    order = ["alone", "dra"] if rnd % 2 == 0 else ["dra", "alone"]
                    for mode in order:
                        result = await dra_round(
                            plane, kube, run, args.pods, mode == "dra", args.sched_qps, kcm
                        )
                        results[mode].append(result)
                        say(
                            f"  round {rnd + 1} {mode:5s}: {result['bound']}/{args.pods} bound, "
                            f"{result['rate']:6.1f} pods/s, all in {result['until_all']:5.1f}s "
                            f" ({load()})"
                        )
                        say(
                            f"    CPU per pod: kube-scheduler {result['scheduler_ms']:5.1f} ms, "
                            f"kube-controller-manager {result['controller_ms']:5.1f} ms, "
                            f"kube-apiserver + etcd {result['api_ms']:5.1f} ms; writes per pod "
                            f"{apiserver.per_pod(result['writes'], result['bound'])}"
                        )
                alone = statistics.median(r["rate"] for r in results["alone"])
                dra = statistics.median(r["rate"] for r in results["dra"])
                say(
                    f"summary at {count} nodes: alone {alone:6.1f} pods/s, DRA {dra:6.1f} pods/s, "
                    f"ratio {dra / alone:4.2f}x ({load()})"
                )
                selector = [("labelSelector", f"{LABEL}={run}")]
                with contextlib.suppress(KubeError):
                    await kube.delete(SLICES, query=selector)
                with contextlib.suppress(KubeError):
                    await kube.delete("/api/v1/nodes", query=selector)
            # the controller deallocates the rounds' claims before it stops (not timed):
            # left allocated, the next part's controller would first work through them
            await wait_claims_freed(kube)
    finally:
        await asyncio.to_thread(kcm.stop)
        with contextlib.suppress(ValueError):
            plane.controller_managers.remove(kcm)


async def dra_one_node(args: argparse.Namespace, plane: ControlPlane) -> None:
    from hami.testkit.cluster import LocalCluster, NodeSpec, Timing

    say(
        f"\n== DRA one node, kubelet emulator: 1 pod, then {args.one_node_pods} at once, timed "
        f"from watch events ({load()})"
    )
    spec = NodeSpec("gpu-one", ({"count": 4, "model": GPU_MODEL, "memory": GPU_MEMORY},))
    async with LocalCluster([spec], plane=plane, timing=Timing(), mode="dra") as cluster:
        await cluster.kube.create(
            templates_path(cluster.namespace), claim_template("slice", mem=1000)
        )
        await marginal_cost(
            cluster,
            spec.name,
            args.one_node_reps,
            args.one_node_pods,
            lambda n: dra_pod(n, ["slice"]),
            dra=True,
        )
