"""End to end on the real control plane: kube-scheduler alone vs kube-scheduler + hami.

    .venv/bin/python bench/bench_e2e.py            # everything, default sizes (65,000 nodes too)
    .venv/bin/python bench/bench_e2e.py --quick    # small sizes (a few minutes)
    .venv/bin/python bench/bench_e2e.py --only throughput --nodes 50 500 --pods 300
    .venv/bin/python bench/bench_e2e.py --only throughput --nodes 50 --background-load 2

Parts (``--only`` picks some):

- ``throughput``: N simulated nodes (Node objects with cpu, pods and 8 fake GPUs x split 10
  in their hami annotations; no kubelet), the same for every round. A round creates the
  pods first, then starts kube-scheduler and times the binds as a pod watch sees them:
  *alone* is kube-scheduler with no extender placing pods that request 100m cpu (its
  NodeResourcesFit scoring MostAllocated for binpack, LeastAllocated for spread); *hami*
  is kube-scheduler with hami (``hami run --role scheduler``, its own process) as
  extender placing pods that ask one 1000 MiB GPU slice, with the node policy in the pod's
  annotation. A stand-in node agent in this process does what the real one does after
  the last Allocate (``bind-phase: success``, node lock released). A third kind of round
  (first round only) adds 100 pods no node can take (``--stuck``), which kube-scheduler
  keeps retrying while it places the others: *alone+stuck* (pods asking 1000 cpus) and
  *hami+stuck* (pods asking more GPU memory than a device has). Rounds interleave the
  kinds and the policies.
  Figures: pods bound/s ((pods - 1) / first to last bind), hami/alone ratio, failed
  binds (``hami_bind_total``), scheduler CPU per placed pod (the hami process's user +
  system time over the round / pods), and what the round cost the API server: its write
  requests per bound pod by verb and resource (kube-apiserver's own
  ``apiserver_request_total``, whoever sent them) and kube-apiserver + etcd CPU per pod.
  ``--background-load N`` runs N busy processes (a CPU-bound loop each) beside every
  round: the figure on a machine with other work.
- ``one-node``: ``hami.testkit.LocalCluster`` with one node (node agent, fake backend,
  kubelet emulator): one pod alone, then ``--one-node-pods`` (10) one-slice pods created
  at once, timed from watch events; figures: the marginal cost of each extra pod and the
  steps of the serial chain it waits on (``_one_node``).
- ``dra`` and ``dra-one-node``: the DRA mode (bench_dra.py): kube-scheduler alone vs
  kube-scheduler allocating DRA claims on the same kind of nodes, and the one-node case.
- ``filter``: an in-process scheduler holding a synthetic cluster (``bench_filter.build``:
  N nodes x 8 GPUs, about half the devices in use) served over HTTP by the role's aiohttp
  routes; a client thread posts ExtenderArgs with all N names: a placeable pod (the same
  pod every call, so its earlier hold is released and the cluster stays the same), an
  unplaceable one, placeable while another process posts unplaceable pods back to back
  (100 pods, four shapes), and placeable while another process scrapes ``/metrics``.
  The no-fit decision is also timed in process: every node's device-level reasons (what
  ``hami explain`` computes, and what a no-fit cost before ``hami.core.nofit``), the
  first time it is asked, and again after one placement changed one node (an answer
  brought up to date).

The load average (``os.getloadavg``) is printed with every part: the figures are only as
quiet as the machine. Sizes the machine's available memory cannot hold (the 65,000-node
rows need several GiB: ``_memory.room_for``) are skipped with a printed reason. A
benchmark, not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _apiserver as apiserver
from _e2e_common import (
    ALONE_NAME,
    GPU_MEMORY,
    GPU_MODEL,
    GPUS,
    HAMI_NAME,
    LABEL,
    PodWatch,
    bench_pod,
    create_nodes,
    delete_all_pods,
    load,
    say,
)
from _memory import room_for
from _one_node import one_node as marginal_cost

from hami import config, log
from hami.kube.client import Kube, open_client, pods_path
from hami.kube.raw import KubeError
from hami.testkit.controlplane import ControlPlane, free_port

# memory per 1,000 nodes (_memory.room_for): throughput holds the nodes in kube-apiserver
# (~80 MiB per 1,000 seen while creating them), etcd, kube-scheduler and the hami process;
# filter builds bench_filter's cluster in this
# process and keeps the metrics text (~65 MiB per 1,000 nodes, docs/performance.md), and
# its scrape client reads the 1.4 GB plain body at 65,000 nodes
THROUGHPUT_MIB_PER_1000_NODES = 160
FILTER_MIB_PER_1000_NODES = 110
SCRAPE_TIMEOUT = 600.0  # seconds a /metrics scrape of the filter part may take


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def ms(samples: list[float]) -> str:
    values = [s * 1000 for s in samples]
    return f"p50 {pct(values, 0.5):7.2f} ms  p99 {pct(values, 0.99):7.2f} ms  (n={len(values)})"


# --------------------------------------------------------------------------- throughput


def kube_scheduler_config(hami: bool, policy: str, extender_port: int) -> dict[str, Any]:
    strategy = "MostAllocated" if policy == "binpack" else "LeastAllocated"
    profile: dict[str, Any] = {
        "schedulerName": HAMI_NAME if hami else ALONE_NAME,
        "pluginConfig": [
            {
                "name": "NodeResourcesFit",
                "args": {"scoringStrategy": {"type": strategy}},
            }
        ],
    }
    data: dict[str, Any] = {
        "podInitialBackoffSeconds": 1,
        "podMaxBackoffSeconds": 1,
        "profiles": [profile],
    }
    if hami:
        data["extenders"] = [
            {
                "urlPrefix": f"http://127.0.0.1:{extender_port}",
                "filterVerb": "filter",
                "bindVerb": "bind",
                "nodeCacheCapable": True,
                "httpTimeout": "30s",
                "weight": 1,
                "managedResources": [
                    {"name": n, "ignoredByScheduler": True}
                    for n in ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")
                ]
                + [{"name": "nvidia.com/gpumem-percentage", "ignoredByScheduler": True}],
            }
        ]
    return data


class HamiProcess:
    """``hami run --role scheduler`` as its own process (its CPU time is read from /proc)."""

    def __init__(self, plane: ControlPlane, workdir: Path, profile: str = "") -> None:
        self.extender_port = free_port()
        self.http_port = free_port()
        cfg = {
            "scheduler": {
                "scheduler_name": HAMI_NAME,
                "http": {"address": "127.0.0.1", "port": self.http_port},
                "extender": {"address": "127.0.0.1", "port": self.extender_port},
                "handshake_timeout": "3600s",
                "handshake_period": "30s",
                "webhook": {"enabled": False},
            },
            "backends": {"nvidia": {"enabled": False}, "fake": {"enabled": True}},
            "log": {"level": "warning"},
        }
        path = workdir / "hami.yaml"
        path.write_text(json.dumps(cfg))
        self.log = (workdir / "hami.log").open("w")
        # --profile-hami: the process runs under cProfile, written when it exits
        profiler = ["-m", "cProfile", "-o", profile] if profile else []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *profiler,
                "-m",
                "hami",
                "run",
                "--role",
                "scheduler",
                "--config",
                str(path),
                "--kubeconfig",
                str(plane.kubeconfig),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hami scheduler exited {self.proc.returncode}")
            with contextlib.suppress(OSError):
                status, _ = http_get(self.http_port, "/readyz")
                if status == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError("hami scheduler not ready")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def failed_binds(self) -> int:
        _, body = http_get(self.http_port, "/metrics")
        total = 0
        for line in body.decode().splitlines():
            if line.startswith("hami_bind_total{") and 'outcome="failed"' in line:
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def http_get(
    port: int, path: str, headers: dict[str, str] | None = None, timeout: float = 60.0
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


async def throughput_round(
    plane: ControlPlane,
    kube: Kube,
    hami: HamiProcess,
    run: str,
    namespace: str,
    pods: int,
    use_hami: bool,
    policy: str,
    stuck: int = 0,
) -> dict[str, Any]:
    gate = asyncio.Semaphore(16)
    prefix = f"{'h' if use_hami else 'a'}-{policy[0]}-{uuid.uuid4().hex[:4]}"

    async def create(i: int) -> None:
        async with gate:
            body = bench_pod(f"{prefix}-{i:04d}", run, use_hami, policy)
            if i >= pods:  # a pod no node can take: kube-scheduler retries it all along
                body["metadata"]["name"] = f"{prefix}-stuck-{i:04d}"
                resources = body["spec"]["containers"][0]["resources"]
                if use_hami:
                    resources["limits"]["nvidia.com/gpumem"] = str(GPU_MEMORY + 1000)
                else:
                    resources["requests"]["cpu"] = "1000"
            await kube.create(pods_path(namespace), body)

    await asyncio.gather(*(create(i) for i in range(pods + stuck)))
    _items, version = await kube.list_all(pods_path(namespace))
    watch = PodWatch(kube, namespace, agent=use_hami)
    watcher = asyncio.create_task(watch.run(version))
    failed_before = hami.failed_binds() if use_hami else 0
    cpu_before = hami.cpu_seconds()
    api_before = await asyncio.to_thread(apiserver.snapshot, plane)
    cfg = kube_scheduler_config(use_hami, policy, hami.extender_port)
    started = time.monotonic()
    sched = await asyncio.to_thread(plane.start_scheduler, cfg, f"ks-{prefix}")
    done = await watch.wait(pods, timeout=max(60.0, pods * 0.5))
    finished = time.monotonic()
    cpu = hami.cpu_seconds() - cpu_before
    await asyncio.to_thread(sched.stop)
    with contextlib.suppress(ValueError):
        plane.schedulers.remove(sched)
    await asyncio.gather(*list(watch.tasks), return_exceptions=True)
    api_after = await asyncio.to_thread(apiserver.snapshot, plane)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    failed = (hami.failed_binds() - failed_before) if use_hami else 0
    times = sorted(watch.bound.values())
    bound = len(times)
    span = times[-1] - times[0] if bound > 1 else float("nan")
    await delete_all_pods(kube, namespace)
    await asyncio.sleep(1.0)  # the hami scheduler sees the deletions
    return {
        "bound": bound,
        "complete": done,
        "rate": (bound - 1) / span if bound > 1 and span > 0 else float("nan"),
        "until_all": (times[-1] - started) if times else float("nan"),
        "failed": failed,
        "cpu_ms_per_pod": cpu * 1000 / bound if (use_hami and bound) else float("nan"),
        # every write the window saw (kube-scheduler's, hami's, the stand-in agent's)
        "writes": apiserver.writes(api_before, api_after),
        "api_cpu_ms_per_pod": (api_after.cpu_seconds - api_before.cpu_seconds) * 1000 / bound
        if bound
        else float("nan"),
        "window_s": finished - started,
    }


async def throughput(args: argparse.Namespace, plane: ControlPlane, workdir: Path) -> None:
    busy = f", {args.background_load} busy processes beside it" if args.background_load else ""
    say(f"\n== throughput: kube-scheduler alone vs + hami{busy} ({load()})")
    hami = HamiProcess(plane, workdir, args.profile_hami)
    try:
        await asyncio.to_thread(hami.wait_ready)
        async with open_client(plane.kubeconfig) as kube:
            for count in args.nodes:
                if room_for(count, THROUGHPUT_MIB_PER_1000_NODES, "throughput"):
                    with background_load(args.background_load):
                        await throughput_at(args, plane, kube, hami, count)
    finally:
        hami.stop()


async def throughput_at(
    args: argparse.Namespace, plane: ControlPlane, kube: Kube, hami: HamiProcess, count: int
) -> None:
    """Every round at ``count`` nodes, then the summary; the nodes are deleted after."""
    run = uuid.uuid4().hex[:6]
    namespace = f"bench-{run}"
    await kube.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    began = time.monotonic()
    await create_nodes(kube, run, count)
    say(f"{count} nodes created in {time.monotonic() - began:.1f}s; {args.pods} pods ({load()})")
    # the hami scheduler's watch takes them in (it keeps up with the creation but for a few)
    await asyncio.sleep(max(2.0, count / 10_000))
    try:
        results = await throughput_rounds(args, plane, kube, hami, run, namespace)
        throughput_summary(args, count, results)
    finally:
        with contextlib.suppress(KubeError):
            await kube.delete(f"/api/v1/namespaces/{namespace}")
        with contextlib.suppress(KubeError):
            await kube.delete("/api/v1/nodes", query=[("labelSelector", f"{LABEL}={run}")])


Results = dict[tuple[str, str], list[dict[str, Any]]]


async def throughput_rounds(
    args: argparse.Namespace,
    plane: ControlPlane,
    kube: Kube,
    hami: HamiProcess,
    run: str,
    namespace: str,
) -> Results:
    results: Results = {}
    for rnd in range(args.rounds):
        # the rounds with stuck pods once: they take longest
        stuck = ["alone+stuck", "hami+stuck"] if args.stuck and rnd == 0 else []
        order = [(p, m) for p in args.policies for m in ["alone", "hami", *stuck]]
        if rnd % 2:
            order.reverse()
        for policy, mode in order:
            result = await throughput_round(
                plane,
                kube,
                hami,
                run,
                namespace,
                args.pods,
                mode.startswith("hami"),
                policy,
                args.stuck if mode.endswith("stuck") else 0,
            )
            results.setdefault((policy, mode), []).append(result)
            say(
                f"  round {rnd + 1} {policy:7s} {mode:11s}: "
                f"{result['bound']}/{args.pods} bound, {result['rate']:6.1f} pods/s, "
                f"all in {result['until_all']:5.1f}s, failed binds {result['failed']}, "
                f"cpu/pod {result['cpu_ms_per_pod']:5.1f} ms, API server cpu/pod "
                f"{result['api_cpu_ms_per_pod']:5.1f} ms  ({load()})"
            )
            written = sum(result["writes"].values()) / max(result["bound"], 1)
            say(
                f"    writes per pod {written:.2f}: "
                f"{apiserver.per_pod(result['writes'], result['bound'])}"
            )
    return results


def throughput_summary(args: argparse.Namespace, count: int, results: Results) -> None:
    say(f"summary at {count} nodes ({load()}):")
    for policy in args.policies:
        alone = statistics.median(r["rate"] for r in results[(policy, "alone")])
        with_hami = statistics.median(r["rate"] for r in results[(policy, "hami")])
        cpu = statistics.median(r["cpu_ms_per_pod"] for r in results[(policy, "hami")])
        failed = sum(r["failed"] for r in results[(policy, "hami")])
        say(
            f"  {policy:7s}: alone {alone:6.1f} pods/s, + hami {with_hami:6.1f} "
            f"pods/s, ratio {with_hami / alone:4.2f}x, failed binds {failed}, "
            f"hami cpu {cpu:5.1f} ms/pod"
        )
        for mode in ("alone", "hami"):
            rounds = results[(policy, mode)]
            writes = statistics.median(
                sum(r["writes"].values()) / max(r["bound"], 1) for r in rounds
            )
            api_cpu = statistics.median(r["api_cpu_ms_per_pod"] for r in rounds)
            say(
                f"  {policy:7s}: {mode:5s} API writes {writes:4.2f}/pod (the bench's pod "
                f"creation before the window not counted), API server + etcd cpu "
                f"{api_cpu:5.1f} ms/pod"
            )
        if args.stuck:
            stuck = statistics.median(r["rate"] for r in results[(policy, "hami+stuck")])
            base = statistics.median(r["rate"] for r in results[(policy, "alone+stuck")])
            say(
                f"  {policy:7s}: with {args.stuck} stuck pods: alone {base:6.1f} "
                f"pods/s ({base / alone:4.2f}x of alone without them), + hami "
                f"{stuck:6.1f} pods/s ({stuck / with_hami:4.2f}x of hami without them)"
            )


@contextlib.contextmanager
def background_load(count: int) -> Iterator[None]:
    """``count`` busy processes (a Python loop each, CPU-bound) for the body: a machine
    with other work on it, as users' machines have, at a fixed and known load."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    if procs:
        say(f"  {count} busy processes started ({load()}; the load average lags a minute)")
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- one node


async def one_node(args: argparse.Namespace, plane: ControlPlane) -> None:
    from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, gpu_pod, limits

    say(
        f"\n== one node, kubelet emulator: 1 pod, then {args.one_node_pods} at once, timed from "
        f"watch events ({load()})"
    )
    spec = NodeSpec("gpu-one", ({"count": 4, "model": GPU_MODEL, "memory": GPU_MEMORY},))
    timing = Timing(register_period=1.0, handshake_period=1.0, handshake_timeout=30.0)
    async with LocalCluster([spec], plane=plane, timing=timing) as cluster:
        await marginal_cost(
            cluster,
            spec.name,
            args.one_node_reps,
            args.one_node_pods,
            lambda n: gpu_pod(n, [limits(1, mem=1000)]),
        )


# --------------------------------------------------------------------------- filter


class Server:
    """The role's extender and probe routes over a scheduler, on a loop in a thread."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.port = free_port()
        self.scheduler: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        import bench_filter
        from aiohttp import web

        from hami.listener import Limits, Listener
        from hami.scheduler.heap import settle
        from hami.scheduler.http import add_extender_routes, add_probe_routes
        from hami.scheduler.service import Scheduler

        cfg = config.from_mapping({"scheduler": {"node_policy": "binpack"}}, env={})
        self.scheduler = Scheduler(cfg.scheduler, [bench_filter.KIND], None, emit_events=False)
        bench_filter.build(self.scheduler, self.nodes, 1)
        self.scheduler.nodes_synced.set()
        self.scheduler.pods_synced.set()
        settle()  # as the role does once its lists are in (else full collections of seconds)
        app = web.Application(client_max_size=4 * 1024 * 1024)
        add_extender_routes(app, self.scheduler, lambda: None)
        add_probe_routes(app, self.scheduler, lambda: None)
        self.listener = Listener(app, Limits())  # the role's defaults
        await self.listener.start("127.0.0.1", self.port)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def wrapped() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.listener.close(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Client:
    """One keep-alive connection posting prepared bodies. The listener drops a connection
    idle for its ``request_timeout`` (5 s; the in-process figures at 65,000 nodes take
    longer than that between two posts), so a post that finds it dropped reconnects and
    is sent again, as an HTTP client's pool does; the retry alone is timed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, path: str, body: bytes) -> tuple[float, dict[str, Any]]:
        try:
            return self._post(path, body)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            return self._post(path, body)

    def _post(self, path: str, body: bytes) -> tuple[float, dict[str, Any]]:
        began = time.perf_counter()
        self.conn.request("POST", path, body, {"Content-Type": "application/json"})
        data = self.conn.getresponse().read()
        took = time.perf_counter() - began  # the answer's bytes are in: decoding is ours
        return took, json.loads(data)


def filter_body(name: str, limits: dict[str, str], names: list[str]) -> bytes:
    pod = {
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


PLACEABLE = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
UNPLACEABLE = (
    {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "50000"},
    {"nvidia.com/gpu": "9", "nvidia.com/gpumem": "1000"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "45000"},
    {"nvidia.com/gpu": "3", "nvidia.com/gpumem": "41000", "nvidia.com/gpucores": "30"},
)


def filter_http(args: argparse.Namespace) -> None:
    for nodes in args.filter_nodes:
        if not room_for(nodes, FILTER_MIB_PER_1000_NODES, "filter over HTTP"):
            continue
        say(f"\n== filter over HTTP at {nodes} nodes x {GPUS} GPUs ({load()})")
        began = time.monotonic()
        server = Server(nodes)
        say(f"  cluster built in {time.monotonic() - began:.1f}s")
        try:
            filter_at(args, server)
        finally:
            server.stop()


def filter_at(args: argparse.Namespace, server: Server) -> None:
    names: list[str] = server.call(lambda: sorted(server.scheduler.cluster.nodes))
    client = Client(server.port)
    placeable = filter_body("fits", PLACEABLE, names)
    unplaceable = filter_body("huge", UNPLACEABLE[0], names)
    calls = args.calls

    def run(body: bytes, n: int, placed: bool) -> list[float]:
        samples: list[float] = []
        for _ in range(n):
            took, answer = client.post("/filter", body)
            assert answer.get("Error") == "", answer
            assert bool(answer.get("NodeNames")) is placed, answer
            samples.append(took)
        return samples

    run(placeable, 5, True)
    say(f"  placeable               {ms(run(placeable, calls, True))}")
    say(f"  unplaceable (repeated)  {ms(run(unplaceable, calls, False))}")
    _took, answer = client.post("/filter", unplaceable)
    encode: list[float] = []
    for _ in range(20):
        began = time.perf_counter()
        json.dumps(answer, separators=(",", ":")).encode()  # as the extender answers
        encode.append(time.perf_counter() - began)
    say(
        f"    of which encoding its {len(answer['FailedNodes'])} FailedNodes "
        f"({len(json.dumps(answer)) / 1e3:.0f} kB) with json  {ms(encode)}"
    )

    cluster = server.scheduler.cluster
    from hami.core.nofit import NoFitCache
    from hami.core.requests import parse_pod

    request = parse_pod(json.loads(unplaceable)["Pod"], server.scheduler.kinds)
    small = parse_pod(json.loads(placeable)["Pod"], server.scheduler.kinds)
    assert request is not None and small is not None

    def decide_ms() -> float:
        began = time.perf_counter()
        decision = cluster.decide(request, names, namespace="bench")
        assert decision.node is None
        return time.perf_counter() - began

    def afresh() -> float:
        cluster.no_fit = NoFitCache()  # nothing kept: the first time this is asked
        return decide_ms()

    def after_a_placement() -> float:
        # what happens between two retries of a stuck pod in a busy cluster
        placed = cluster.decide(small, names, namespace="bench")
        assert placed.node is not None and placed.fit is not None
        cluster.reserve("bench/moved", "uid-moved", placed.node, placed.fit)
        took = decide_ms()
        cluster.release("bench/moved")
        return took

    def detailed() -> float:
        began = time.perf_counter()
        cluster.explain(request, names, namespace="bench")
        return time.perf_counter() - began

    full = [server.call(detailed) for _ in range(3)]
    say(f"  every node's device-level reasons (explain's path) {ms(full)}")
    first = [server.call(afresh) for _ in range(max(3, calls // 20))]
    say(f"  no fit, first time (decide, in process)           {ms(first)}")
    server.call(decide_ms)
    moved = [server.call(after_a_placement) for _ in range(calls)]
    say(f"  no fit, after a placement (decide, in process)    {ms(moved)}")

    bodies = Path(tempfile.mkstemp(prefix="bench-e2e-burst-")[1])
    with bodies.open("wb") as out:
        for i in range(100):  # 100 stuck pods, four shapes
            out.write(filter_body(f"stuck-{i}", UNPLACEABLE[i % len(UNPLACEABLE)], names) + b"\n")
    try:
        with client_process("burst", server.port, str(bodies)) as burst:
            during = run(placeable, calls, True)
            burst.terminate()
            burst_calls = int((burst.communicate()[0] or "0").split()[-1])
    finally:
        bodies.unlink()
    say(
        f"  placeable during a burst of unplaceable ({burst_calls} calls, 100 pods, "
        f"another process): {ms(during)}"
    )

    during_scrape: list[float] = []
    with client_process("scrape", server.port) as scraper:
        deadline = time.monotonic() + 300
        while scraper.poll() is None and time.monotonic() < deadline:
            during_scrape.extend(run(placeable, 5, True))
        scrapes = json.loads(scraper.communicate()[0] or "[]")
    if scrapes:
        plain_s = statistics.median(s[0] for s in scrapes)
        gzip_s = statistics.median(s[2] for s in scrapes)
        say(
            f"  /metrics scrape: {plain_s * 1000:.0f} ms for {scrapes[0][1] / 1e6:.1f} MB, "
            f"gzip {gzip_s * 1000:.0f} ms for {scrapes[0][3] / 1e6:.2f} MB"
        )
    if during_scrape:
        say(
            f"  placeable during scrapes  {ms(during_scrape)}  "
            f"max {max(during_scrape) * 1000:.1f} ms  ({load()})"
        )


@contextlib.contextmanager
def client_process(kind: str, port: int, bodies: str = "") -> Iterator[subprocess.Popen[str]]:
    """Another process posting (``burst``) or scraping (``scrape``): its CPU is not this
    process's, as kube-scheduler's and Prometheus' are not the scheduler's."""
    argv = [sys.executable, __file__, "--client", kind, "--port", str(port), "--bodies", bodies]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "ready"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_client(kind: str, port: int, bodies: str) -> None:
    """The child side of ``client_process``."""
    import signal

    print("ready", flush=True)
    if kind == "scrape":
        results = []
        for _ in range(3):
            began = time.perf_counter()
            # 65,000 nodes: 1.4 GB plain, and the gzip body takes 30-45 s to build
            _, plain = http_get(port, "/metrics", timeout=SCRAPE_TIMEOUT)
            middle = time.perf_counter()
            _, packed = http_get(
                port, "/metrics", {"Accept-Encoding": "gzip"}, timeout=SCRAPE_TIMEOUT
            )
            results.append((middle - began, len(plain), time.perf_counter() - middle, len(packed)))
        print(json.dumps(results), flush=True)
        return
    lines = Path(bodies).read_bytes().splitlines()
    calls = 0
    stop = [False]

    def finish(*_: Any) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, finish)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while not stop[0]:
        conn.request(
            "POST", "/filter", lines[calls % len(lines)], {"Content-Type": "application/json"}
        )
        conn.getresponse().read()
        calls += 1
    print(calls, flush=True)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    parser.add_argument(
        "--only",
        nargs="*",
        choices=["throughput", "one-node", "filter", "dra", "dra-one-node"],
        default=None,
    )
    parser.add_argument("--nodes", type=int, nargs="*", default=None, help="default 50 500 65000")
    parser.add_argument("--pods", type=int, default=None, help="pods per round (default 300)")
    parser.add_argument("--rounds", type=int, default=None, help="default 2")
    parser.add_argument("--policies", nargs="*", default=["binpack", "spread"])
    parser.add_argument(
        "--stuck", type=int, default=None, help="pods no node takes, beside hami's (default 100)"
    )
    parser.add_argument("--one-node-reps", type=int, default=None, help="default 2")
    parser.add_argument(
        "--one-node-pods", type=int, default=10, help="pods created at once on one node"
    )
    parser.add_argument(
        "--sched-qps",
        type=int,
        default=0,
        help="dra part: kube-scheduler's API client QPS (burst 2x) for both kinds of round "
        "(default: kube-scheduler's own, 50/100)",
    )
    parser.add_argument(
        "--filter-nodes",
        type=int,
        nargs="*",
        default=None,
        help="default 1000 5000 15000 65000",
    )
    parser.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="throughput part: N busy processes (a CPU-bound loop each) run beside it",
    )
    parser.add_argument("--calls", type=int, default=None, help="filter calls per figure")
    parser.add_argument(
        "--profile-hami", default="", metavar="FILE", help="cProfile the hami scheduler process"
    )
    parser.add_argument("--client", choices=["burst", "scrape"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--bodies", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    args.nodes = args.nodes or ([50] if quick else [50, 500, 65000])
    args.pods = args.pods or (100 if quick else 300)
    args.rounds = args.rounds or (1 if quick else 2)
    args.stuck = (20 if quick else 100) if args.stuck is None else args.stuck
    args.one_node_reps = args.one_node_reps or (1 if quick else 2)
    args.filter_nodes = args.filter_nodes or ([1000] if quick else [1000, 5000, 15000, 65000])
    args.calls = args.calls or (50 if quick else 200)
    args.only = set(args.only or ["throughput", "one-node", "filter", "dra", "dra-one-node"])
    return args


async def main_async(args: argparse.Namespace) -> None:
    say(f"bench_e2e: {' '.join(sys.argv[1:]) or '(defaults)'}; {load()}")
    random.seed(1)
    if args.only & {"throughput", "one-node", "dra", "dra-one-node"}:
        with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
            plane = ControlPlane()
            await asyncio.to_thread(plane.start)
            try:
                if "throughput" in args.only:
                    await part("throughput", throughput(args, plane, Path(tmp)))
                if "one-node" in args.only:
                    await part("one-node", one_node(args, plane))
                # the DRA mode (bench_dra.py; docs/performance.md "DRA mode")
                import bench_dra

                if "dra" in args.only:
                    await part("dra", bench_dra.dra_throughput(args, plane))
                if "dra-one-node" in args.only:
                    await part("dra-one-node", bench_dra.dra_one_node(args, plane))
            finally:
                await asyncio.to_thread(plane.stop)
    if "filter" in args.only:
        await part("filter", asyncio.to_thread(filter_http, args))


async def part(name: str, work: Awaitable[None]) -> None:
    """One part of the benchmark; one that breaks is reported and the others still run."""
    try:
        await work
    except Exception as exc:
        say(f"\n!! {name} did not complete: {exc!r}")


def main() -> None:
    log.configure("warning", "console", stream=sys.__stderr__)
    args = parse_args()
    if args.client:
        run_client(args.client, args.port, args.bodies)
        return
    began = time.monotonic()
    asyncio.run(main_async(args))
    say(f"\nbench_e2e done in {time.monotonic() - began:.0f}s ({load()})")


if __name__ == "__main__":
    main()
