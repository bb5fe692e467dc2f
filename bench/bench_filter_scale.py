"""Filter at large node counts with a freshly decoded node list per call (issue 20 item 1).

    .venv/bin/python bench/bench_filter_scale.py                       # 5000 and 65000 nodes
    .venv/bin/python bench/bench_filter_scale.py --nodes 65000 --calls 500
    .venv/bin/python bench/bench_filter_scale.py --nodes 65000 --profile full

The clusters are ``bench_filter.build``'s (N nodes x 8 devices, about half in use). Every
call goes through ``Scheduler.filter`` on a body decoded with ``orjson.loads`` from its
bytes right before the call, as the HTTP layer does, so no call sees the list object of
another (a cache keyed on the object would never hit). Two lists:

- ``full``: every node's name (kube-scheduler with ``percentageOfNodesToScore: 100``);
- ``kube``: what kube-scheduler sends with its adaptive default: ``max(100, N x p)`` nodes
  with ``p = max(5, 50 - N / 125)`` % (10 % at 5,000 nodes, 5 % at 65,000), a run of its
  node list starting where the previous cycle stopped (``nextStartNodeIndex``);
- ``shuffled`` (not by default): every name, in a new order each call, as kube-scheduler's
  parallel filter might send them with ``percentageOfNodesToScore: 100`` (``Lists.shuffled``).

Figures (decoding is not in them; it is printed apart):

- ``filter``: placeable pods (``bench_filter``'s eight shapes), each placement released
  after the call so the cluster stays at the same fill;
- ``no fit``: a pod nothing can take (2 x 50000 MiB), asked between placements (so the
  cluster changed in between, as when kube-scheduler retries); ``first ask`` is the
  first of each run, printed apart. Every node is grouped by summary
  (``hami.core.nofit.Summaries``) once the cluster is built, as the scheduler role does
  once both initial lists are in (the time is printed); with ``--no-group`` the first
  no-fit ask of the first run does it instead. With ``kube`` lists every ask is of a
  list not seen before;
- ``decode``: ``orjson.loads`` of the body;
- ``rss``: the process's resident memory after the cluster is built.

``--profile full kube`` runs the placeable calls under cProfile and prints the top
functions. A benchmark, not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import math
import os
import pstats
import random
import subprocess
import sys
import time
from typing import Any

import orjson
from bench_filter import KIND, build, percentile, request_pods, rss_mib

from hami import config, log
from hami.scheduler.service import Scheduler

IMPOSSIBLE = {
    "metadata": {"name": "huge", "namespace": "bench", "uid": "huge"},
    "spec": {
        "containers": [
            {
                "name": "c",
                "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "50000"}},
            }
        ]
    },
}


KINDS = ["full", "kube", "shuffled"]


def kube_count(nodes: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with the adaptive percentage."""
    if nodes < 100:
        return nodes
    percentage = max(5, 50 - nodes // 125)
    return max(100, nodes * percentage // 100)


class Lists:
    """The node names of each call, as kube-scheduler would send them."""

    def __init__(self, names: list[str], kind: str, seed: int) -> None:
        self.names, self.kind, self.start = names, kind, 0
        self.rng = random.Random(seed)

    def next(self) -> list[str]:
        if self.kind == "full":
            return self.names
        if self.kind == "shuffled":
            return self.shuffled()
        count, total = kube_count(len(self.names)), len(self.names)
        chosen = [self.names[(self.start + i) % total] for i in range(count)]
        self.start = (self.start + count) % total
        return chosen

    def shuffled(self) -> list[str]:
        """Every name, in the order kube-scheduler's parallel filter (16 workers taking
        chunks of ~sqrt(N) nodes) might append them: the chunks of each group of 16
        interleaved, each name a little early or late (an emulation, not its code)."""
        names, total = self.names, len(self.names)
        chunk = max(1, min(math.isqrt(total), total // 16 + 1))
        out: list[str] = []
        for start in range(0, total, 16 * chunk):
            block = names[start : start + 16 * chunk]
            where = [
                (j % chunk) * 16 + j // chunk + self.rng.gauss(0, 32) for j in range(len(block))
            ]
            out.extend(block[j] for j in sorted(range(len(block)), key=where.__getitem__))
        return out


def show(label: str, ms: list[float], cpu: list[float] | None = None) -> str:
    line = (
        f"{label:8s} p50 {percentile(ms, 0.5):8.3f} ms  p99 {percentile(ms, 0.99):8.3f} ms"
        f"  max {max(ms):8.3f} ms"
    )
    if cpu:
        line += f"  cpu p50 {percentile(cpu, 0.5):7.3f} p99 {percentile(cpu, 0.99):7.3f} ms"
    return line + f"  ({len(ms)} calls)"


async def run(
    scheduler: Scheduler, lists: Lists, calls: int, seed: int, profile: bool
) -> dict[str, Any]:
    shapes = request_pods()
    rng = random.Random(seed)
    fit_ms: list[float] = []
    fit_cpu: list[float] = []
    nofit_ms: list[float] = []
    nofit_cpu: list[float] = []
    decode_ms: list[float] = []
    first: float | None = None
    profiler = cProfile.Profile() if profile else None
    for call in range(calls):
        names = lists.next()
        shape = rng.choice(shapes)
        raw = orjson.dumps({"Pod": shape, "NodeNames": names})
        began = time.perf_counter()
        body = orjson.loads(raw)
        decode_ms.append((time.perf_counter() - began) * 1000)
        if profiler is not None:
            profiler.enable()
        began, cpu = time.perf_counter(), time.thread_time()
        answer = await scheduler.filter(body)
        fit_ms.append((time.perf_counter() - began) * 1000)
        fit_cpu.append((time.thread_time() - cpu) * 1000)
        if profiler is not None:
            profiler.disable()
        assert answer["Error"] == "" and answer["NodeNames"], answer
        scheduler.cluster.release(f"bench/{shape['metadata']['name']}")
        if call % 5 == 4:  # a no-fit pod asked again after the cluster changed
            body = orjson.loads(orjson.dumps({"Pod": IMPOSSIBLE, "NodeNames": names}))
            began, cpu = time.perf_counter(), time.thread_time()
            answer = await scheduler.filter(body)
            took = (time.perf_counter() - began) * 1000
            assert not answer["NodeNames"] and len(answer["FailedNodes"]) == len(names)
            if first is None:
                first = took  # after a build: groups every node by summary (once)
            else:
                nofit_ms.append(took)
                nofit_cpu.append((time.thread_time() - cpu) * 1000)
    top = ""
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        top = out.getvalue()
    return {
        "fit": fit_ms,
        "fit_cpu": fit_cpu,
        "nofit": nofit_ms,
        "nofit_cpu": nofit_cpu,
        "decode": decode_ms,
        "first": first or 0,
        "top": top,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[5000, 65000])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--lists", nargs="*", default=["full", "kube"], choices=KINDS)
    parser.add_argument("--policy", nargs="*", default=["binpack", "spread"])
    parser.add_argument("--profile", nargs="*", choices=KINDS, default=[])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-group",
        dest="group",
        action="store_false",
        help="leave the summary grouping to the first no-fit ask (the role before 2026-12-04)",
    )
    args = parser.parse_args()
    log.configure("warning", "console", stream=sys.stderr)
    configurations = [(n, p) for n in args.nodes for p in args.policy]
    if len(configurations) > 1:
        # one process per cluster: a cluster left from the one before (and its garbage)
        # would slow the next one's calls
        load = os.getloadavg()
        print(f"load average {load[0]:.2f} {load[1]:.2f} on {os.cpu_count()} cpus", flush=True)
        common = ["--calls", str(args.calls), "--seed", str(args.seed), "--lists", *args.lists]
        if args.profile:
            common += ["--profile", *args.profile]
        common += [] if args.group else ["--no-group"]
        for nodes, policy in configurations:
            command = [sys.executable, __file__, *common, "--nodes", str(nodes), "--policy", policy]
            subprocess.run(command, check=True)
        return
    for nodes, policy in configurations:
        measure(nodes, policy, args)


def measure(nodes: int, policy: str, args: argparse.Namespace) -> None:
    cfg = config.from_mapping({"scheduler": {"node_policy": policy}}, env={})
    scheduler = Scheduler(cfg.scheduler, [KIND], None, emit_events=False)
    began = time.perf_counter()
    pods = build(scheduler, nodes, args.seed)
    built = time.perf_counter() - began
    scheduler.nodes_synced.set()
    scheduler.pods_synced.set()
    gc.collect()
    grouped = 0.0
    if args.group:  # as the role does once both lists are in (role._settle_heap)
        began = time.perf_counter()
        scheduler.cluster.group_summaries()
        grouped = time.perf_counter() - began
    print(
        f"== {nodes} nodes x 8 devices, {policy}: {pods} running pods, "
        f"built in {built:.0f}s, nodes grouped by summary in {grouped * 1000:.0f} ms, "
        f"rss {rss_mib():.0f} MiB, load {os.getloadavg()[0]:.2f}"
    )
    names = sorted(scheduler.cluster.nodes)
    for kind in args.lists:
        lists = Lists(names, kind, args.seed)
        result = asyncio.run(run(scheduler, lists, args.calls, args.seed, kind in args.profile))
        size = kube_count(len(names)) if kind == "kube" else len(names)
        print(f"  list {kind} ({size} names), load {os.getloadavg()[0]:.2f}")
        print("    " + show("filter", result["fit"], result["fit_cpu"]))
        print("    " + show("no fit", result["nofit"], result["nofit_cpu"]))
        print(f"    no fit, first ask {result['first']:.1f} ms")
        print("    " + show("decode", result["decode"]))
        if result["top"]:
            print(result["top"])
    print(f"  rss {rss_mib():.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
