"""Garbage-collector pauses, tracked objects and RSS at large node counts (issue 20 item 2).

    .venv/bin/python bench/bench_gc.py --nodes 65000                  # as the role runs
    .venv/bin/python bench/bench_gc.py --nodes 65000 --no-tune        # CPython's defaults
    .venv/bin/python bench/bench_gc.py --nodes 15000 65000 --calls 300
    .venv/bin/python bench/bench_gc.py --nodes 65000 --real-ids      # cluster-length ids

One process per cluster (``bench_filter.build``'s: N nodes x 8 devices, about half in
use). Every collection is timed through ``gc.callbacks`` (``perf_counter`` at its start
and stop), by generation and by phase:

- ``build``: the initial node and pod lists going in (the reflectors' first lists);
- ``filter``: ``Scheduler.filter`` calls with freshly decoded ``full`` and ``kube`` lists
  (``bench_filter_scale.run``: placements released after each call, a no-fit pod every
  fifth call);
- ``relist``: every Node, then every running Pod (unless ``--no-pods``) seen again
  unchanged with a new resourceVersion (watch relists after 410 Gone), then filter calls
  again; the longest single event is printed too. Each page of ``PAGE_SIZE`` objects is
  made and handed over before the next, as ``Reflector._list`` does; ``--held`` holds the
  whole list meanwhile instead (the reflector before f582cbb).

During the build the heap is frozen after every ``PAGE_SIZE`` objects handed over, as the
role's reflectors do after each page of their initial lists (``heap.freeze_listed``);
``--no-page-freeze`` leaves that out (before f582cbb).

Unless ``--no-tune``, the heap is settled once both lists are in, as the scheduler role
does when both reflectors report synced (``hami.scheduler.heap.settle``). Printed:
pauses (count, p99, max, total, and the longest in CPU time: this machine is shared)
per phase and generation, ``gc.get_count()``, tracked
and frozen objects, RSS after the build and at the end, filter p50/p99 per list.
A benchmark, not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from bench_filter import KIND, build, percentile, rss_mib
from bench_filter_scale import Lists, kube_count
from bench_filter_scale import run as run_calls

from hami import config, log
from hami.kube.client import PAGE_SIZE
from hami.kube.reflector import HAND_OVER_BATCH
from hami.protocol import encode_pod_devices
from hami.scheduler.heap import freeze_listed, settle
from hami.scheduler.service import Scheduler


class Pauses:
    """Every collection's wall time, by (phase, generation)."""

    def __init__(self) -> None:
        self.phase = "build"
        self.began = self.cpu = 0.0
        self.samples: dict[tuple[str, int], list[float]] = defaultdict(list)
        self.cpu_ms: dict[tuple[str, int], list[float]] = defaultdict(list)
        self.collected = 0

    def __call__(self, what: str, info: dict[str, Any]) -> None:
        if what == "start":
            self.began, self.cpu = time.perf_counter(), time.thread_time()
            return
        ms = (time.perf_counter() - self.began) * 1000
        self.samples[(self.phase, info["generation"])].append(ms)
        self.cpu_ms[(self.phase, info["generation"])].append((time.thread_time() - self.cpu) * 1000)
        self.collected += info.get("collected", 0)

    def report(self, phase: str) -> list[str]:
        lines = []
        for gen in (0, 1, 2):
            ms = self.samples.get((phase, gen), [])
            if not ms:
                lines.append(f"    gen {gen}: none")
                continue
            lines.append(
                f"    gen {gen}: {len(ms):6d} passes  p99 {percentile(ms, 0.99):8.2f} ms"
                f"  max {max(ms):8.2f} ms  total {sum(ms):8.0f} ms"
                f"  (cpu max {max(self.cpu_ms[(phase, gen)]):7.2f} ms)"
            )
        return lines


def tracked() -> str:
    frozen = gc.get_freeze_count()
    return f"tracked {len(gc.get_objects()):,} (+{frozen:,} frozen), counts {gc.get_count()}"


def calls(scheduler: Scheduler, names: list[str], args: argparse.Namespace) -> list[str]:
    lines = []
    for kind in ("full", "kube"):
        lists = Lists(names, kind, args.seed)
        result = asyncio.run(run_calls(scheduler, lists, args.calls, args.seed, False))
        fit = result["fit"]
        size = kube_count(len(names)) if kind == "kube" else len(names)
        lines.append(
            f"    filter {kind} ({size}): p50 {percentile(fit, 0.5):.2f} ms"
            f"  p99 {percentile(fit, 0.99):.2f} ms  max {max(fit):.2f} ms"
            f"  (cpu p99 {percentile(result['fit_cpu'], 0.99):.2f} ms;"
            f" no fit p99 {percentile(result['nofit'], 0.99):.2f} ms)"
        )
    return lines


def deliver(
    handler: Any, items: Iterator[dict[str, Any]], held: bool
) -> tuple[float, float, float]:
    """Hand every listed object over a page at a time (as ``Reflector._list``), or with
    the whole list held meanwhile (``--held``). The longest event, and the longest hold
    of the event loop (``/filter`` waits that long), in ms: a batch of ``HAND_OVER_BATCH``
    objects now, the whole list before f582cbb (it was handed over without a yield), and
    that hold's CPU time (this machine is shared)."""
    longest = hold = hold_cpu = 0.0
    pages = [list(items)] if held else iter(lambda: list(islice(items, PAGE_SIZE)), [])
    batch = sys.maxsize if held else HAND_OVER_BATCH
    for page in pages:
        for start in range(0, len(page), batch):
            began_batch, cpu = time.perf_counter(), time.thread_time()
            for obj in page[start : start + batch]:
                began = time.perf_counter()
                handler("MODIFIED", obj)
                longest = max(longest, time.perf_counter() - began)
            if time.perf_counter() - began_batch > hold:
                hold, hold_cpu = time.perf_counter() - began_batch, time.thread_time() - cpu
        del page
    return longest * 1000, hold * 1000, hold_cpu * 1000


def node_objects(scheduler: Scheduler) -> Iterator[dict[str, Any]]:
    """Every Node again with a new resourceVersion, made as its page is listed."""
    for name in list(scheduler.cluster.nodes):  # strings only: nothing for gc to track
        node = scheduler.cluster.nodes[name]
        # the register value bench_filter.build wrote (the cluster keeps only a digest)
        register = "".join(
            f"{d.uuid},{d.count},{d.total_memory},{d.total_cores},{d.model},{d.numa},true:"
            for d in next(iter(node.types.values())).devices
        )
        yield {  # bench_filter.build's annotations, a new resourceVersion
            "metadata": {
                "name": name,
                "resourceVersion": "2",
                "annotations": {
                    "hami.io/node-nvidia-register": register,
                    "hami.io/node-handshake-nvidia": "Reported_2024-05-20 10:00:00",
                },
            }
        }


def pod_objects(scheduler: Scheduler) -> Iterator[dict[str, Any]]:
    """Every running pod again, unchanged, made as its page is listed."""
    for key in list(scheduler.cluster.pods):
        record = scheduler.cluster.pods[key]
        namespace, name = key.split("/", 1)
        yield {  # bench_filter.build's pod
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": record.uid,
                "resourceVersion": "2",
                "annotations": {
                    "hami.io/vgpu-node": record.node,
                    "hami.io/vgpu-devices-allocated": encode_pod_devices(
                        record.assignment[KIND.type_word]
                    ),
                    "hami.io/bind-phase": "success",
                },
            },
            "spec": {"nodeName": record.node, "containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        }


class PageFreezer:
    """Freezes after every ``PAGE_SIZE`` objects handed over during the build, as the
    reflectors' ``after_initial_page`` does; times each freeze."""

    def __init__(self) -> None:
        self.handed = 0
        self.ms: list[float] = []

    def wrap(self, handler: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
        def counted(kind: str, obj: Any) -> None:
            handler(kind, obj)
            self.handed += 1
            if self.handed % PAGE_SIZE == 0:
                began = time.perf_counter()
                freeze_listed()
                self.ms.append((time.perf_counter() - began) * 1000)

        return counted


def measure(nodes: int, args: argparse.Namespace) -> None:
    pauses = Pauses()
    gc.callbacks.append(pauses)
    cfg = config.from_mapping({"scheduler": {"node_policy": args.policy}}, env={})
    scheduler = Scheduler(cfg.scheduler, [KIND], None, emit_events=False)
    freezer = PageFreezer()
    if args.page_freeze:  # instance attributes over the methods, for the build only
        scheduler.on_node = freezer.wrap(scheduler.on_node)  # type: ignore[method-assign,assignment]
        scheduler.on_pod = freezer.wrap(scheduler.on_pod)  # type: ignore[method-assign,assignment]
    began = time.perf_counter()
    pods = build(scheduler, nodes, args.seed, real_ids=args.real_ids)
    built = time.perf_counter() - began
    if args.page_freeze:
        del scheduler.on_node, scheduler.on_pod
    scheduler.nodes_synced.set()
    scheduler.pods_synced.set()
    settled = ""
    if args.tune:
        began = time.perf_counter()
        settle()
        settled = f", settled in {(time.perf_counter() - began) * 1000:.0f} ms"
    print(
        f"== {nodes} nodes x 8 devices, {args.policy}, {'tuned' if args.tune else 'defaults'},"
        f" relist {'held' if args.held else 'paged'},"
        f" {'page freezes' if args.page_freeze else 'no page freeze'},"
        f" {'real-length' if args.real_ids else 'short'} ids"
        f" (threshold {gc.get_threshold()}): {pods} running pods, built in {built:.0f}s"
        f"{settled}, load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(f"  after build: rss {rss_mib():.0f} MiB, {tracked()}")
    if freezer.ms:
        print(
            f"  page freezes: {len(freezer.ms)}, max {max(freezer.ms):.2f} ms,"
            f" total {sum(freezer.ms):.0f} ms"
        )
    print("  build pauses:")
    print("\n".join(pauses.report("build")))
    names = sorted(scheduler.cluster.nodes)
    pauses.phase = "filter"
    lines = calls(scheduler, names, args)
    print(f"  filter (load {os.getloadavg()[0]:.2f}):")
    print("\n".join(lines))
    print("\n".join(pauses.report("filter")))
    pauses.phase = "relist"
    began = time.perf_counter()
    longest, hold, cpu = deliver(scheduler.on_node, node_objects(scheduler), args.held)
    took = time.perf_counter() - began
    began = time.perf_counter()
    longest_pod = hold_pod = cpu_pod = 0.0
    if args.pods:
        longest_pod, hold_pod, cpu_pod = deliver(
            scheduler.on_pod, pod_objects(scheduler), args.held
        )
    took_pods = time.perf_counter() - began
    lines = calls(scheduler, names, args)
    print(
        f"  relist of {nodes} nodes in {took:.1f}s (longest upsert {longest:.2f} ms, loop held"
        f" {hold:.1f} ms, cpu {cpu:.1f}), of {len(scheduler.cluster.pods)} pods in"
        f" {took_pods:.1f}s (longest {longest_pod:.2f} ms, loop held {hold_pod:.1f} ms,"
        f" cpu {cpu_pod:.1f}), then filter"
        f" (load {os.getloadavg()[0]:.2f}):"
    )
    print("\n".join(lines))
    print("\n".join(pauses.report("relist")))
    print(f"  end: rss {rss_mib():.0f} MiB, {tracked()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[65000])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--policy", default="binpack")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-tune", dest="tune", action="store_false")
    parser.add_argument("--no-pods", dest="pods", action="store_false", help="relist nodes only")
    parser.add_argument("--held", action="store_true", help="relists hold the whole list")
    parser.add_argument(
        "--no-page-freeze", dest="page_freeze", action="store_false", help="no freeze per page"
    )
    parser.add_argument(
        "--real-ids",
        action="store_true",
        help="device ids, pod names and uids as long as a real cluster's (bench_filter.build)",
    )
    args = parser.parse_args()
    log.configure("warning", "console", stream=sys.stderr)
    if len(args.nodes) > 1:  # one process per cluster
        for nodes in args.nodes:
            command = [sys.executable, __file__, "--nodes", str(nodes), "--calls", str(args.calls)]
            command += ["--policy", args.policy, "--seed", str(args.seed)]
            command += [] if args.tune else ["--no-tune"]
            command += ["--real-ids"] if args.real_ids else []
            command += (["--held"] if args.held else []) + (
                [] if args.page_freeze else ["--no-page-freeze"]
            )
            subprocess.run(command + ([] if args.pods else ["--no-pods"]), check=True)
        return
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    measure(args.nodes[0], args)


if __name__ == "__main__":
    main()
