"""Time the scheduler's filter on synthetic clusters and print p50/p99 and memory.

    .venv/bin/python bench/bench_filter.py                 # 100, 1,000, 5,000, 65,000 nodes
    .venv/bin/python bench/bench_filter.py --nodes 5000 --calls 2000

Each cluster has N nodes x 8 devices (split 10, A100 40 GiB and V100 32 GiB nodes), and
running pods filling about half of the devices (some full, some shared). Requests are a
mix of shapes: one device with memory, several devices by percentage, cores, whole
devices, type selectors. Every call is answered against all N node names, as
kube-scheduler sends them with ``nodeCacheCapable: true``.

Figures:
- ``decision``: ``Cluster.decide`` plus the in-memory reservation (what a filter call
  computes); the reservation is rolled back after each call so the cluster stays steady;
- ``filter``: ``Scheduler.filter`` on the decoded ExtenderArgs (request parsing, decision,
  reservation, annotation values, answer); filter makes no API call (the decision is
  written at bind), and a client that fails every call proves it;
- ``json``: decoding the HTTP body with N node names and encoding the answer;
- ``no fit``: a pod no node can take, so every node gets its full reason;
- ``rss``: the process's resident memory after building the largest cluster.

A size the machine's available memory cannot hold (``_memory.room_for``: about 25 MiB per
1,000 nodes) is skipped with a printed reason.

A benchmark, not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from _memory import room_for

from hami import config, log
from hami.backends.nvidia_names import NVIDIA_ALLOCATED, NVIDIA_RESOURCES, NVIDIA_TO_ALLOCATE
from hami.core.cluster import Cluster
from hami.core.requests import DeviceKind, parse_pod
from hami.protocol import ContainerDevice, encode_pod_devices
from hami.scheduler.service import Scheduler

KIND = DeviceKind("nvidia", "NVIDIA", NVIDIA_RESOURCES, NVIDIA_ALLOCATED, NVIDIA_TO_ALLOCATE)
DEVICES = 8
# resident memory of a cluster of this benchmark: ~1,200 MiB at 65,000 nodes (bench_gc)
MIB_PER_1000_NODES = 25
SPLIT = 10
MODELS = (("NVIDIA-A100-SXM4-40GB", 40960), ("NVIDIA-Tesla V100-PCIE-32GB", 32768))
NOW_STAMP = "Reported_2024-05-20 10:00:00"


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def build(scheduler: Scheduler, nodes: int, seed: int, *, real_ids: bool = False) -> int:
    """Nodes with register annotations, and running pods on about half of the devices.

    ``real_ids``: device ids, pod names and uids as long as a cluster's (GPU-8-4-4-4-12
    hex, a Deployment's pod name, a UUID uid) instead of short counters; the same
    placements either way (the ids come from a second random stream)."""
    rng = random.Random(seed)
    ids = random.Random(seed + 1)
    pods = 0
    for n in range(nodes):
        name = f"node-{n:05d}"
        model, memory = MODELS[n % 2]
        uuids = [
            f"GPU-{uuid.UUID(int=ids.getrandbits(128))}" if real_ids else f"GPU-{n:05d}-{d}"
            for d in range(DEVICES)
        ]
        value = "".join(
            f"{u},{SPLIT},{memory},100,{model},{d // 4},true:" for d, u in enumerate(uuids)
        )
        scheduler.on_node(
            "ADDED",
            {
                "metadata": {
                    "name": name,
                    "resourceVersion": "1",
                    "annotations": {
                        "hami.io/node-nvidia-register": value,
                        "hami.io/node-handshake-nvidia": NOW_STAMP,
                    },
                }
            },
        )
        for d in rng.sample(range(DEVICES), DEVICES // 2):
            shape = rng.random()
            if shape < 0.25:  # a whole device
                holds = [(memory, 100)]
            elif shape < 0.5:  # nearly full
                holds = [(memory // 2, 40), (memory // 2 - 1024, 40)]
            else:  # shared by a few
                holds = [
                    (rng.choice((2048, 4096, 8192)), rng.choice((0, 10, 20)))
                    for _ in range(rng.randint(1, 4))
                ]
            for mem, cores in holds:
                pods += 1
                entry = [[ContainerDevice(uuids[d], "NVIDIA", mem, cores)]]
                scheduler.on_pod(
                    "ADDED",
                    {
                        "metadata": {
                            "name": (
                                f"train-{ids.getrandbits(40):010x}-{ids.getrandbits(20):05x}"
                                if real_ids
                                else f"run-{pods}"
                            ),
                            "namespace": "bench",
                            "uid": (
                                str(uuid.UUID(int=ids.getrandbits(128)))
                                if real_ids
                                else f"uid-{pods}"
                            ),
                            "annotations": {
                                "hami.io/vgpu-node": name,
                                "hami.io/vgpu-devices-allocated": encode_pod_devices(entry),
                                "hami.io/bind-phase": "success",
                            },
                        },
                        "spec": {"nodeName": name, "containers": [{"name": "c"}]},
                        "status": {"phase": "Running"},
                    },
                )
    return pods


def request_pods() -> list[dict[str, Any]]:
    def pod(i: int, limits: dict[str, str], annotations: dict[str, str] | None = None) -> Any:
        return {
            "metadata": {
                "name": f"new-{i}",
                "namespace": "bench",
                "uid": f"new-{i}",
                "annotations": annotations or {},
            },
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
        }

    return [
        pod(0, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}),
        pod(1, {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "30"}),
        pod(2, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "50"}),
        pod(3, {"nvidia.com/gpu": "1"}),  # whole memory of an idle-enough device
        pod(4, {"nvidia.com/gpu": "4", "nvidia.com/gpumem": "2000"}),
        pod(
            5,
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"},
            {"nvidia.com/use-gputype": "a100"},
        ),
        pod(
            6,
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"},
            {"hami.io/node-scheduler-policy": "spread"},
        ),
        pod(
            7,
            {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "6000", "nvidia.com/gpucores": "30"},
            {"nvidia.com/numa-bind": "true"},
        ),
    ]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def show(label: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return (
        f"{label:9s} p50 {percentile(ms, 0.5):7.3f} ms  p99 {percentile(ms, 0.99):7.3f} ms"
        f"  mean {statistics.fmean(ms):7.3f} ms"
    )


def timed(fn: Callable[[], Any], calls: int) -> list[float]:
    samples: list[float] = []
    for _ in range(calls):
        began = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - began)
    return samples


async def run(
    nodes: int, calls: int, policy: str, seed: int, candidates: int = 0, warmup: int = 0
) -> dict[str, Any]:
    cfg = config.from_mapping({"scheduler": {"node_policy": policy}}, env={})
    scheduler = Scheduler(cfg.scheduler, [KIND], None, emit_events=False)
    began = time.perf_counter()
    pods = build(scheduler, nodes, seed)
    built = time.perf_counter() - began
    scheduler.nodes_synced.set()
    scheduler.pods_synced.set()
    cluster: Cluster = scheduler.cluster
    names = sorted(cluster.nodes)
    shapes = request_pods()
    requests = [parse_pod(p, [KIND]) for p in shapes]
    rng = random.Random(seed)
    gc.collect()

    outcomes = {"fit": 0, "nofit": 0}

    def asked() -> list[str]:
        """The names of one call: all of them, or a fresh sample of ``candidates`` (what
        kube-scheduler sends once percentageOfNodesToScore has cut its search short)."""
        return rng.sample(names, candidates) if 0 < candidates < len(names) else names

    def draws(count: int) -> Iterator[tuple[int, list[str]]]:
        """The calls' requests and name lists, drawn before the clock starts (drawing a
        sample of 500 names costs ~0.2 ms, which is kube-scheduler's, not ours)."""
        return iter([(rng.randrange(len(requests)), asked()) for _ in range(count)])

    upcoming = draws(warmup)

    def decision() -> None:
        index, names_asked = next(upcoming)
        request = requests[index]
        assert request is not None
        result = cluster.decide(request, names_asked)
        if result.node is not None and result.fit is not None:
            outcomes["fit"] += 1
            key = f"bench/new-{index}"
            previous = cluster.reserve(key, key, result.node, result.fit)
            cluster.rollback(key, previous)
        else:
            outcomes["nofit"] += 1

    for _ in range(warmup):  # a policy that learns the workload (defrag) settles first
        decision()
    outcomes = {"fit": 0, "nofit": 0}
    upcoming = draws(calls)
    decision_samples = timed(decision, calls)

    class NoApi:
        """Filter must not touch the API server: any call fails the benchmark."""

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"filter called the API ({name})")

    scheduler.kube = NoApi()  # type: ignore[assignment]
    filter_samples: list[float] = []
    try:
        bodies: list[dict[str, Any]] = [
            {"Pod": rng.choice(shapes), "NodeNames": asked()} for _ in range(calls)
        ]
        for body in bodies:
            shape = body["Pod"]
            began_call = time.perf_counter()
            answer = await scheduler.filter(body)
            filter_samples.append(time.perf_counter() - began_call)
            assert answer["Error"] == "", answer
            chosen = answer["NodeNames"]
            if chosen:
                key = f"bench/{shape['metadata']['name']}"
                cluster.release(key)
    finally:
        scheduler.kube = None

    impossible = parse_pod(
        {
            "metadata": {"name": "huge"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "resources": {
                            "limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "50000"}
                        },
                    }
                ]
            },
        },
        [KIND],
    )
    assert impossible is not None
    nofit_samples = timed(lambda: cluster.decide(impossible, names), max(10, calls // 50))
    raw = json.dumps({"Pod": shapes[0], "NodeNames": names}).encode()
    json_samples = timed(
        lambda: json.dumps(
            {"NodeNames": [json.loads(raw)["NodeNames"][0]], "FailedNodes": {}, "Error": ""}
        ),
        min(calls, 300),
    )
    return {
        "nodes": nodes,
        "policy": policy,
        "pods": pods,
        "build_s": built,
        "decision": decision_samples,
        "filter": filter_samples,
        "json": json_samples,
        "nofit": nofit_samples,
        "outcomes": outcomes,
        "rss": rss_mib(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[100, 1000, 5000, 65000])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--policy", nargs="*", default=["binpack", "spread"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--candidates",
        type=int,
        default=0,
        help="names per call: a fresh random sample of this many (0: every node); "
        "kube-scheduler's default percentageOfNodesToScore sends about 500 at 5,000 nodes",
    )
    parser.add_argument(
        "--warmup", type=int, default=0, help="untimed decisions first (defrag's window)"
    )
    args = parser.parse_args()
    # As in a cluster: the per-pod debug lines are off (printing them would be measured).
    log.configure("warning", "console", stream=sys.stderr)
    for nodes in args.nodes:
        if not room_for(nodes, MIB_PER_1000_NODES, "bench_filter"):
            continue
        for policy in args.policy:
            result = asyncio.run(
                run(nodes, args.calls, policy, args.seed, args.candidates, args.warmup)
            )
            asked = f"{args.candidates} names per call" if args.candidates else "every name"
            print(
                f"== {nodes} nodes x {DEVICES} devices, node policy {policy}, {asked}: "
                f"{result['pods']} running pods, built in {result['build_s']:.1f}s, "
                f"{result['outcomes']['fit']}/{args.calls} decisions fit"
            )
            print("  " + show("decision", result["decision"]))
            print("  " + show("filter", result["filter"]))
            print("  " + show("json", result["json"]))
            print("  " + show("no fit", result["nofit"]) + "  (every node's reason)")
            print(f"  rss       {result['rss']:.0f} MiB")


if __name__ == "__main__":
    main()
