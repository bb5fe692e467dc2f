"""Time the node agent's Allocate and registration against a real API server; print memory.

    .venv/bin/python bench/bench_node.py                      # 100 pods per shape, 100 passes
    .venv/bin/python bench/bench_node.py --pods 200 --passes 200

What runs: etcd + kube-apiserver (``hami.testkit.ControlPlane``, loopback only), a Node
object, and a ``NodeAgent`` with the ``fake`` backend (``--devices`` devices, split
``--split``) serving the device plugin on a unix socket. No kubelet and no scheduler: the
benchmark plays both. For each pod it does what the HAMi scheduler's bind does (pod
created bound to the node with ``vgpu-node``, ``devices-allocated``,
``devices-to-allocate``, ``bind-phase: allocating``, ``bind-time``; the node lock set on
the Node), untimed, then for each container does what kubelet does on the plugin socket:
``GetPreferredAllocation`` over all replicas, then ``Allocate`` of the replica it got, and
times both calls.

Figures:
- ``allocate``: per container, p50/p90/p99 of the gRPC ``Allocate`` call, for 1-container
  and 3-container pods, with an in-process agent whose Allocator requests are counted and
  timed: ``API p50`` is the time an Allocate spent awaiting them; ``API round trips /
  Allocate`` is every request of the run over the Allocate calls, the node lock releases
  sent after kubelet's answer included (the agent finds the pod in its watches, so this is
  the pod patch, plus the lock release for a pod's last container; an API read where the
  watches cannot settle it, ``hami/node/allocate.py``); ``plan`` is ``plan_allocation``
  alone (the pure decision, no I/O). Like kubelet, which calls Allocate once its own watch
  shows the bound pod, the benchmark waits (untimed) for the agent's watch to show it
  (``--no-wait``: it does not; the agent then reads the API server more often), and, like
  the scheduler, for the previous pod's lock release before binding the next;
- ``GetPreferred``: kubelet's ``GetPreferredAllocation`` before each Allocate (it finds
  the pod the same way, under the same per-node lock);
- ``containers/s``: containers per second with calls back to back, both calls counted
  (they are serialised per node, so this is one node's ceiling);
- ``registration``: one pass of the registration loop (re-enumerate + one merge patch of
  the register value and heartbeat) for 8 and 64 devices; ``encode`` is building the
  annotation values alone;
- ``process``: the same workload against ``hami run --role node`` as its own process (the
  DaemonSet's shape), with its resident memory idle (after start-up and first
  registration) and after the Allocate runs.

A benchmark, not a test: it prints figures and never fails on them. Everything it starts
(control plane, agent process, temp dirs) is stopped and removed on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from grpclib.client import Channel

from hami import log
from hami._proto.v1beta1 import api_grpc, api_pb2
from hami.backends.base import BackendSettings
from hami.backends.fake import FakeBackend
from hami.config import Config
from hami.kube.client import Kube, open_client
from hami.kube.raw import KubeError, RetryPolicy
from hami.node.agent import NodeAgent
from hami.node.allocate import plan_allocation
from hami.node.metrics import NodeMetrics
from hami.node.registration import Registrar, registration_annotations
from hami.node.state import DeviceState
from hami.protocol import ContainerDevice, NodeLock, encode_pod_devices, keys
from hami.testkit.cluster import poll
from hami.testkit.controlplane import ControlPlane, free_port

NAMESPACE = "hami-bench"
MODEL, MEMORY = "NVIDIA-A100-SXM4-40GB", 40960
ALLOCATED = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
REGISTER = "hami.io/node-nvidia-register"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(samples: list[float], q: float) -> str:
    return f"{percentile(samples, q) * 1000:.2f}"


def rss_mib(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def fake_options(node: str, devices: int, host: Path) -> dict[str, Any]:
    return {
        "devices": [{"count": devices, "model": MODEL, "memory": MEMORY}],
        "uuid_prefix": f"GPU-{node}",
        "hamicore": {"containers_dir": str(host / "containers")},
    }


# --------------------------------------------------------------------------- API timing


@dataclass
class ApiTally:
    """Kubernetes calls the allocator made, and the time spent awaiting them."""

    calls: int = 0
    seconds: float = 0.0
    by_call: dict[str, int] = field(default_factory=dict)

    def wrap(self, name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - began
                self.calls += 1
                self.by_call[name] = self.by_call.get(name, 0) + 1

        return timed


def call_name(method: str, path: str) -> str:
    """``GET node``, ``PATCH pod``, ``GET pods`` (a list), ... for a request path."""
    if path.startswith("/api/v1/nodes/"):
        return f"{method} node"
    if path.endswith("/pods"):
        return f"{method} pods"
    return f"{method} pod"


class TalliedKube(Kube):
    """A ``Kube`` whose requests are timed into ``tally`` once ``counting``: the agent hands
    ``with_retry``'s client to its Allocator (counted: each request is one round trip) and
    keeps this one for registration and its watches (not per-Allocate work)."""

    def __init__(self, kube: Kube, tally: ApiTally, *, counting: bool = False) -> None:
        super().__init__(kube.api, kube.retry)
        self.tally = tally
        self.counting = counting

    def with_retry(self, policy: RetryPolicy) -> TalliedKube:
        return TalliedKube(Kube(self.api, policy), self.tally, counting=True)

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if not self.counting:
            return await super().request(method, path, **kwargs)
        send = self.tally.wrap(call_name(method, path), super().request)
        return await send(method, path, **kwargs)


# --------------------------------------------------------------------------- the scheduler's part


async def create_node(kube: Kube, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    try:
        await kube.request("POST", "/api/v1/nodes", body=body)
    except KubeError as exc:
        if exc.status != 409:
            raise


def bound_pod(name: str, node: str, entries: list[list[ContainerDevice]]) -> dict[str, Any]:
    """A pod as the HAMi scheduler leaves it after bind: on the node, allocating."""
    value = encode_pod_devices(entries)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "annotations": {
                keys.VGPU_NODE: node,
                ALLOCATED: value,
                TO_ALLOCATE: value,
                keys.BIND_PHASE: "allocating",
                keys.BIND_TIME: str(int(time.time())),
            },
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": str(len(devices))}},
                }
                for i, devices in enumerate(entries)
            ],
        },
    }


@dataclass
class AllocateRun:
    latency: list[float] = field(default_factory=list)  # per container (one gRPC call)
    api: list[float] = field(default_factory=list)  # per container, API time inside it
    api_calls: list[int] = field(default_factory=list)
    plan: list[float] = field(default_factory=list)  # plan_allocation alone
    by_call: dict[str, int] = field(default_factory=dict)
    preferred: list[float] = field(default_factory=list)  # GetPreferredAllocation
    preferred_api_calls: list[int] = field(default_factory=list)
    steered_wrong: int = 0  # a preferred replica not on the scheduler's device
    errors: int = 0
    served: dict[str, int] = field(default_factory=dict)  # lookups from the watches / the API


async def unlocked(kube: Kube, node: str) -> bool:
    annotations = (await kube.get_node(node))["metadata"].get("annotations") or {}
    return keys.NODE_LOCK not in annotations


async def allocate_pods(
    kube: Kube,
    node: str,
    socket: Path,
    uuids: list[str],
    split: int,
    containers: int,
    pods: int,
    tag: str,
    tally: ApiTally | None = None,
    backend: FakeBackend | None = None,
    seen: Callable[[str], Awaitable[bool]] | None = None,
) -> AllocateRun:
    """Bind ``pods`` pods of ``containers`` containers (untimed), then Allocate each
    container over gRPC as kubelet would and time the calls."""
    run = AllocateRun()
    channel = Channel(path=str(socket))
    stub = api_grpc.DevicePluginStub(channel)
    replicas = [f"{u}-{i}" for u in uuids for i in range(split)]
    devices = backend.enumerate() if backend is not None else None
    node_devices = await devices if devices is not None else []
    try:
        for p in range(pods):
            name = f"{tag}-{containers}c-{p}"
            entries = [
                [ContainerDevice(uuids[(p * containers + c) % len(uuids)], "NVIDIA", 2000, 10)]
                for c in range(containers)
            ]
            created = await kube.request(
                "POST",
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                body=bound_pod(name, node, entries),
            )
            # the scheduler binds the next pod once the last one's lock is released (the
            # agent releases it after answering kubelet): wait for that too, untimed
            await poll(partial(unlocked, kube, node), 10, "the node lock's release", 0.001)
            lock = NodeLock(datetime.now(UTC), NAMESPACE, name).encode()
            await kube.patch_node_annotations(node, {keys.NODE_LOCK: lock})
            if seen is not None:
                # kubelet calls Allocate once its own watch shows the bound pod; the
                # agent's watch runs alongside it: wait for it too (untimed)
                await poll(partial(seen, name), 10, f"the agent's watch to show {name}", 0.001)
            if backend is not None:
                began = time.perf_counter()
                plan_allocation(created, backend, [1], node_devices)
                run.plan.append(time.perf_counter() - began)
            for c in range(containers):
                # kubelet asks which replica to take first (GetPreferredAllocation), then
                # allocates the one it picked
                calls, spent = (tally.calls, tally.seconds) if tally else (0, 0.0)
                began = time.perf_counter()
                preferred = await stub.GetPreferredAllocation(
                    api_pb2.PreferredAllocationRequest(
                        container_requests=[
                            api_pb2.ContainerPreferredAllocationRequest(
                                available_deviceIDs=replicas, allocation_size=1
                            )
                        ]
                    ),
                    timeout=30,
                )
                run.preferred.append(time.perf_counter() - began)
                if tally is not None:
                    run.preferred_api_calls.append(tally.calls - calls)
                replica = preferred.container_responses[0].deviceIDs[0]
                if replica.rpartition("-")[0] != entries[c][0].uuid:
                    run.steered_wrong += 1
                req = api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[replica])]
                )
                calls, spent = (tally.calls, tally.seconds) if tally else (0, 0.0)
                began = time.perf_counter()
                try:
                    await stub.Allocate(req, timeout=30)
                except Exception as exc:
                    run.errors += 1
                    if run.errors == 1:
                        print(f"  allocate error: {exc}", file=sys.stderr)
                    break
                run.latency.append(time.perf_counter() - began)
                if tally is not None:
                    run.api.append(tally.seconds - spent)
                    run.api_calls.append(tally.calls - calls)
    finally:
        channel.close()
    return run


# --------------------------------------------------------------------------- in-process agent


async def _registered(agent: NodeAgent) -> bool:
    registrar = agent.registrars.get("fake")
    return registrar is not None and registrar.last_success is not None


async def in_process(
    kube: Kube, work: Path, args: argparse.Namespace
) -> tuple[dict[int, AllocateRun], ApiTally]:
    node = "bench-node-a"
    await create_node(kube, node)
    tally = ApiTally()
    backend = FakeBackend(
        BackendSettings(split_count=args.split, options=fake_options(node, args.devices, work))
    )
    agent = NodeAgent(
        Config(),
        node_name=node,
        kube=TalliedKube(kube, tally),
        backends={"fake": backend},
        register_period=3600,  # one registration at start-up, none during the runs
        device_plugin_dir=str(work / "plugins"),
        serve_http=False,
        kubelet_poll=3600,
    )
    task = asyncio.create_task(agent.run(), name="bench-agent")
    results: dict[int, AllocateRun] = {}
    try:
        await agent.wait_ready(30)
        # the start-up registration goes through the same tally: let it finish first
        await poll(lambda: _registered(agent), 30, "the first registration", interval=0.05)
        socket = work / "plugins" / "hami-nvidia.sock"
        uuids = [d.uuid for d in await backend.enumerate()]
        cache = agent.cache

        async def seen(name: str) -> bool:
            if cache is None or args.no_wait:
                return True
            meta = (cache.node_object or {}).get("metadata") or {}
            lock = (meta.get("annotations") or {}).get(keys.NODE_LOCK, "")
            return lock.endswith(f",{name}") and cache.pod(NAMESPACE, name) is not None

        for containers in (1, 3):
            before = dict(tally.by_call)
            assert agent.allocator is not None
            served = dict(agent.allocator.served)
            run = await allocate_pods(
                kube,
                node,
                socket,
                uuids,
                args.split,
                containers,
                args.pods,
                "in",
                tally,
                backend,
                seen,
            )
            run.by_call = {k: v - before.get(k, 0) for k, v in tally.by_call.items()}
            run.served = {k: v - served[k] for k, v in agent.allocator.served.items()}
            results[containers] = run
    finally:
        await agent.stop()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    return results, tally


# --------------------------------------------------------------------------- registration


async def registration(kube: Kube, work: Path, devices: int, passes: int) -> dict[str, list[float]]:
    node = f"bench-reg-{devices}"
    await create_node(kube, node)
    backend = FakeBackend(
        BackendSettings(split_count=10, options=fake_options(node, devices, work))
    )
    state = DeviceState("fake", backend)
    state.bind_loop()
    state.set_enumerated(await backend.enumerate())

    registrar = Registrar(state, kube, node=node, period=3600, metrics=NodeMetrics())
    await registrar.refresh()
    await registrar.write_once()  # warm-up: the first write adds the keys
    whole: list[float] = []
    encode: list[float] = []
    for _ in range(passes):
        began = time.perf_counter()
        await registrar.refresh()
        ok = await registrar.write_once()
        whole.append(time.perf_counter() - began)
        assert ok, "registration patch failed"
        began = time.perf_counter()
        registration_annotations(state, datetime.now(UTC))
        encode.append(time.perf_counter() - began)
    size = len(registration_annotations(state, datetime.now(UTC))[REGISTER])
    return {"pass": whole, "encode": encode, "bytes": [float(size)]}


# --------------------------------------------------------------------------- agent process


async def healthz(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        body: dict[str, Any] = await response.json()
        return body


def spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start the agent in its own session (so it can be killed as a group), output to a file."""
    with open(log_path, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


async def agent_process(
    kube: Kube, plane: ControlPlane, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    node = "bench-node-p"
    await create_node(kube, node)
    plugins = work / "proc-plugins"
    port = free_port()
    cfg = {
        "log": {"level": "warning", "format": "json"},
        "node": {
            "register_period": "30s",
            "device_plugin_dir": str(plugins),
            "http": {"address": "127.0.0.1", "port": port},
        },
        "backends": {
            "nvidia": {"enabled": False},
            "fake": {
                "enabled": True,
                "split_count": args.split,
                **fake_options(node, args.devices, work / "proc"),
            },
        },
    }
    cfg_path = work / "node.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    log_path = work / "agent.log"
    argv = [sys.executable, "-m", "hami", "run", "--role", "node", "--config", str(cfg_path)]
    argv += ["--kubeconfig", str(plane.kubeconfig), "--node-name", node]
    began = time.perf_counter()
    proc = spawn(argv, log_path)
    socket = plugins / "hami-nvidia.sock"
    try:

        async def registered() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"agent exited ({proc.returncode}): {log_path.read_text()}")
            annotations = (await kube.get_node(node))["metadata"].get("annotations") or {}
            return socket.exists() and REGISTER in annotations

        await poll(registered, 60, "the agent process to register", interval=0.05)
        startup = time.perf_counter() - began
        await asyncio.sleep(1.0)
        idle = rss_mib(proc.pid)
        uuids = [f"GPU-{node}-{i}" for i in range(args.devices)]
        url = f"http://127.0.0.1:{port}/healthz"
        names: set[str] = set()

        async def seen(name: str) -> bool:
            # the agent's watch has every bench pod of its node (none is ever deleted)
            names.add(name)
            if args.no_wait:
                return True
            status = await healthz(url)
            return int((status.get("pod_cache") or {}).get("pods", 0)) >= len(names)

        runs = {}
        for c in (1, 3):
            before = (await healthz(url)).get("allocate_reads") or {}
            runs[c] = await allocate_pods(
                kube, node, socket, uuids, args.split, c, args.pods, "proc", seen=seen
            )
            reads = (await healthz(url)).get("allocate_reads") or {}
            runs[c].served = {k: int(v) - int(before.get(k, 0)) for k, v in reads.items()}
        after = rss_mib(proc.pid)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                await asyncio.to_thread(proc.wait, 5)
    return {"startup": startup, "idle": idle, "after": after, "runs": runs}


# --------------------------------------------------------------------------- report


ALLOCATE_HEADER = (
    "| containers/pod | Allocate calls | Allocate p50 / p90 / p99 | GetPreferred p50 / p99 "
    "| containers/s |"
)
API_HEADER = " API p50 (share) | API round trips / Allocate | API calls / GetPreferred | plan p50 |"


def allocate_rows(runs: dict[int, AllocateRun], with_api: bool) -> list[str]:
    rows = []
    for containers, run in runs.items():
        lat, pref = run.latency, run.preferred
        if not lat:
            rows.append(f"| {containers} | 0 | (every call failed: {run.errors} errors) |")
            continue
        # kubelet's admission of a container is both calls, each serialised on the node
        per_second = len(lat) / (sum(lat) + sum(pref[: len(lat)]))
        row = (
            f"| {containers} | {len(lat)} | {ms(lat, 0.5)} / {ms(lat, 0.9)} / {ms(lat, 0.99)} ms"
            f" | {ms(pref, 0.5)} / {ms(pref, 0.99)} ms | {per_second:.0f} |"
        )
        if with_api:
            share = sum(run.api) / sum(lat)
            # every round trip of the run, the lock releases sent after an answer included
            trips = sum(run.by_call.values()) / len(lat)
            row += (
                f" {ms(run.api, 0.5)} ms ({share:.0%}) | {trips:.2f}"
                f" | {statistics.fmean(run.preferred_api_calls):.2f}"
                f" | {statistics.median(run.plan) * 1e6:.0f} µs |"
            )
        rows.append(row)
    return rows


def notes(runs: dict[int, AllocateRun]) -> list[str]:
    out = []
    for containers, run in runs.items():
        line = f"  {containers}-container pods: {run.errors} errors"
        line += f", {run.steered_wrong} preferred replicas off the scheduler's device"
        if run.served:
            line += (
                f"; pod found in the watches {run.served.get('cache', 0)} times, "
                f"by API reads {run.served.get('api', 0)} (GetPreferred and Allocate)"
            )
        if run.by_call:
            calls = ", ".join(f"{k} {v}" for k, v in sorted(run.by_call.items()))
            per_trip = sum(run.api) / max(1, sum(run.api_calls))
            line += f"; API calls in all: {calls}; mean round trip {per_trip * 1000:.2f} ms"
        out.append(line)
    return out


async def bench(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="hb-node-", dir="/tmp"))
    plane: ControlPlane | None = None
    try:
        plane = ControlPlane()
        await asyncio.to_thread(plane.start)
        print(
            f"== node agent: fake backend, {args.devices} devices x split {args.split}, "
            f"{args.pods} pods per shape; etcd + kube-apiserver up in "
            f"{plane.startup_seconds or 0:.1f}s"
        )
        async with open_client(plane.kubeconfig) as kube:
            await kube.request(
                "POST",
                "/api/v1/namespaces",
                body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            )
            runs, _ = await in_process(kube, work, args)
            print("\nAllocate over gRPC, in-process agent (kubelet's two calls per container)")
            print(ALLOCATE_HEADER + API_HEADER)
            print("|---:|---:|---|---|---:|---|---:|---:|---:|")
            for row in allocate_rows(runs, with_api=True):
                print(row)
            for line in notes(runs):
                print(line)

            print("\nRegistration pass (enumerate + one merge patch)")
            print("| devices | value size | pass p50 / p99 | encode p50 |")
            print("|---:|---:|---|---:|")
            for devices in (8, 64):
                reg = await registration(kube, work, devices, args.passes)
                encode_us = statistics.median(reg["encode"]) * 1e6
                print(
                    f"| {devices} | {int(reg['bytes'][0])} B | {ms(reg['pass'], 0.5)} / "
                    f"{ms(reg['pass'], 0.99)} ms | {encode_us:.0f} µs |"
                )

            if not args.no_process:
                proc = await agent_process(kube, plane, work, args)
                print(
                    f"\nAgent process (`hami run --role node`), registered "
                    f"{proc['startup']:.1f}s after exec"
                )
                print(ALLOCATE_HEADER)
                print("|---:|---:|---|---|---:|")
                for row in allocate_rows(proc["runs"], with_api=False):
                    print(row)
                for line in notes(proc["runs"]):
                    print(line)
                print(
                    f"  agent RSS: idle {proc['idle']:.0f} MiB; after {2 * args.pods} pods "
                    f"({4 * args.pods} Allocate calls) {proc['after']:.0f} MiB"
                )
    finally:
        if plane is not None:
            await asyncio.to_thread(plane.stop)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=100, help="pods per shape (1 and 3 containers)")
    parser.add_argument("--passes", type=int, default=100, help="registration passes per size")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--split", type=int, default=10)
    parser.add_argument("--no-process", action="store_true", help="skip the agent process run")
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="call Allocate right after the bind, without waiting for the agent's watch",
    )
    args = parser.parse_args()
    log.configure("warning", "console", stream=sys.stderr)
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
