"""The defrag policy's decision cost against how many distinct pods it is asked about.

    .venv/bin/python bench/bench_defrag.py                       # 5,000 nodes; 1, 8, 36 sizes
    .venv/bin/python bench/bench_defrag.py --nodes 5000 --sizes 1 8 --calls 1000

The cluster is ``bench_filter.build``'s (N nodes x 8 GPUs, about half the devices in use)
with a random free CPU (8-96 cores) and memory (32 GiB-1 TiB) per node, as the scheduler
keeps them from the node and pod watches. Each call asks one of ``bench_filter``'s eight
device requests with one of S pod sizes (CPU and memory requests drawn from common
values) over a fresh sample of 500 names (what kube-scheduler's default
``percentageOfNodesToScore`` sends at 5,000 nodes), then reserves and rolls back, as
bench_filter's ``decision`` does. One size is a Deployment's replicas; many sizes is a
cluster of unrelated pods: the policy keeps each node's result per (request, pod size),
so the cost grows with the sizes in the mix. Every size count runs in one process, one
after the other, on the same cluster.

A benchmark, not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time

from bench_filter import KIND, build, percentile, request_pods

from hami import config, log
from hami.core.requests import PodRequest, parse_pod
from hami.scheduler.service import Scheduler

CPU_MILLI = (500, 1000, 2000, 4000, 8000, 16000)
MEMORY_MIB = (1024, 4096, 8192, 16384, 32768, 65536)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 8, 36])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="rows the scheduler role's idle task fills ahead between two calls (its "
        "slice is 64; 0: none, as when pods come back to back)",
    )
    args = parser.parse_args()
    log.configure("warning", "console", stream=sys.stderr)
    cfg = config.from_mapping({"scheduler": {"node_policy": "defrag"}}, env={})
    scheduler = Scheduler(cfg.scheduler, [KIND], None, emit_events=False)
    build(scheduler, args.nodes, args.seed)
    cluster = scheduler.cluster
    rng = random.Random(args.seed)
    names = sorted(cluster.nodes)
    for name in names:
        cluster.set_node_room(
            name, rng.randrange(8000, 96000, 500), rng.randrange(32768, 1048576, 1024)
        )
    requests: list[PodRequest] = []
    for pod in request_pods():
        request = parse_pod(pod, [KIND])
        assert request is not None
        requests.append(request)
    print(
        f"{args.nodes} nodes x 8 GPUs, {args.candidates} names per call, node policy defrag, "
        f"rows filled ahead between calls {args.prefill}, load {os.getloadavg()[0]:.1f}"
    )
    for count in args.sizes:
        sizes = [(rng.choice(CPU_MILLI), rng.choice(MEMORY_MIB)) for _ in range(count)]

        def draw(
            sizes: list[tuple[int, int]] = sizes,
        ) -> tuple[PodRequest, list[str], tuple[int, int]]:
            return (
                rng.choice(requests),
                rng.sample(names, args.candidates),
                rng.choice(sizes),
            )

        def decide(request: PodRequest, asked: list[str], room: tuple[int, int]) -> None:
            result = cluster.decide(request, asked, pod_room=room)
            if result.node is not None and result.fit is not None:
                previous = cluster.reserve("bench/p", "p", result.node, result.fit)
                cluster.rollback("bench/p", previous)

        for call in [draw() for _ in range(args.warmup)]:
            decide(*call)
            if args.prefill:
                cluster.prefill_defrag(args.prefill)
        gc.collect()
        samples: list[float] = []
        for call in [draw() for _ in range(args.calls)]:
            began = time.perf_counter()
            decide(*call)
            samples.append((time.perf_counter() - began) * 1000)
            if args.prefill:  # idle time between two pods, not timed
                cluster.prefill_defrag(args.prefill)
        print(
            f"  {count:3d} pod sizes: decision p50 {percentile(samples, 0.5):6.3f} ms  "
            f"p99 {percentile(samples, 0.99):7.3f} ms  (load {os.getloadavg()[0]:.1f})"
        )


if __name__ == "__main__":
    main()
