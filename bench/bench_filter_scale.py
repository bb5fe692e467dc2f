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
  node list starting where the previous cycle stopped (``nextStartNodeIndex``).

Figures (decoding is not in them; it is printed apart):

- ``filter``: placeable pods (``bench_filter``'s eight shapes), each placement released
  after the call so the cluster stays at the same fill;
- ``no fit``: a pod nothing can take (2 x 50000 MiB), asked between placements (so the
  cluster changed in between, as when kube-scheduler retries); ``first ask`` is the
  first of each run, printed apart: in the first run after the cluster was built it also
  groups every node by summary, once (``hami.core.nofit.Summaries``). With ``kube``
  lists every ask is of a list not seen before;
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
import os
import pstats
import random
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


def kube_count(nodes: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with the adaptive percentage."""
    if nodes < 100:
        return nodes
    percentage = max(5, 50 - nodes // 125)
    return max(100, nodes * percentage // 100)


class Lists:
    """The node names of each call, as kube-scheduler would send them."""

    def __init__(self, names: list[str], kind: str) -> None:
        self.names, self.kind, self.start = names, kind, 0

    def next(self) -> list[str]:
        if self.kind == "full":
            return self.names
        count, total = kube_count(len(self.names)), len(self.names)
        chosen = [self.names[(self.start + i) % total] for i in range(count)]
        self.start = (self.start + count) % total
        return chosen


def show(label: str, ms: list[float]) -> str:
    return (
        f"{label:8s} p50 {percentile(ms, 0.5):8.3f} ms  p99 {percentile(ms, 0.99):8.3f} ms"
        f"  max {max(ms):8.3f} ms  ({len(ms)} calls)"
    )


async def run(
    scheduler: Scheduler, lists: Lists, calls: int, seed: int, profile: bool
) -> dict[str, Any]:
    shapes = request_pods()
    rng = random.Random(seed)
    fit_ms: list[float] = []
    nofit_ms: list[float] = []
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
        began = time.perf_counter()
        answer = await scheduler.filter(body)
        fit_ms.append((time.perf_counter() - began) * 1000)
        if profiler is not None:
            profiler.disable()
        assert answer["Error"] == "" and answer["NodeNames"], answer
        scheduler.cluster.release(f"bench/{shape['metadata']['name']}")
        if call % 5 == 4:  # a no-fit pod asked again after the cluster changed
            body = orjson.loads(orjson.dumps({"Pod": IMPOSSIBLE, "NodeNames": names}))
            began = time.perf_counter()
            answer = await scheduler.filter(body)
            took = (time.perf_counter() - began) * 1000
            assert not answer["NodeNames"] and len(answer["FailedNodes"]) == len(names)
            if first is None:
                first = took  # after a build: groups every node by summary (once)
            else:
                nofit_ms.append(took)
    top = ""
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        top = out.getvalue()
    return {"fit": fit_ms, "nofit": nofit_ms, "decode": decode_ms, "first": first or 0, "top": top}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[5000, 65000])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--lists", nargs="*", default=["full", "kube"], choices=["full", "kube"])
    parser.add_argument("--policy", nargs="*", default=["binpack", "spread"])
    parser.add_argument("--profile", nargs="*", choices=["full", "kube"], default=[])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    log.configure("warning", "console", stream=sys.stderr)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} on {os.cpu_count()} cpus")
    for nodes in args.nodes:
        for policy in args.policy:
            cfg = config.from_mapping({"scheduler": {"node_policy": policy}}, env={})
            scheduler = Scheduler(cfg.scheduler, [KIND], None, emit_events=False)
            began = time.perf_counter()
            pods = build(scheduler, nodes, args.seed)
            built = time.perf_counter() - began
            scheduler.nodes_synced.set()
            scheduler.pods_synced.set()
            gc.collect()
            print(
                f"== {nodes} nodes x 8 devices, {policy}: {pods} running pods, "
                f"built in {built:.0f}s, rss {rss_mib():.0f} MiB, "
                f"load {os.getloadavg()[0]:.2f}"
            )
            names = sorted(scheduler.cluster.nodes)
            for kind in args.lists:
                lists = Lists(names, kind)
                profile = kind in args.profile
                result = asyncio.run(run(scheduler, lists, args.calls, args.seed, profile))
                size = len(names) if kind == "full" else kube_count(len(names))
                print(f"  list {kind} ({size} names), load {os.getloadavg()[0]:.2f}")
                print("    " + show("filter", result["fit"]))
                first = f"  first ask {result['first']:.1f} ms"
                print("    " + show("no fit", result["nofit"]) + first)
                print("    " + show("decode", result["decode"]))
                if result["top"]:
                    print(result["top"])
            print(f"  rss {rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
