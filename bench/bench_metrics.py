"""Time a ``/metrics`` scrape of the scheduler role on a synthetic cluster, and how much it
delays the event loop (and the filter calls) while it runs.

    .venv/bin/python bench/bench_metrics.py                  # 1000 and 5000 nodes
    .venv/bin/python bench/bench_metrics.py --nodes 15000

Each cluster has N nodes x 8 devices with real-length GPU UUIDs, and running pods on
about half of the devices (``bench_filter.build``'s shapes). The scheduler's probe app
serves ``/metrics`` on a local port; ``curl`` (another process) scrapes it, so the
client's reading is not counted against the scheduler's loop. Meanwhile two tasks run on
the scheduler's loop: a probe that sleeps 1 ms in a loop and records how late it wakes
(the longest stall of the loop), and a filter loop calling ``Scheduler.filter`` (the pod
patch stubbed out) whose reservations change a node between scrapes, as placements do.

Figures per scrape: bytes, seconds (curl's total), the longest single step of the loop
(what the scrape's own work holds it for), the longest loop stall (as the probe sees it:
also time the OS gave to other processes), the longest garbage collection pause, the
slowest filter call during the scrape. The first scrape renders every node (a cold cache); the
next ones only what changed since. A benchmark, not a test: it never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import gc
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_filter

from hami import config, log
from hami.scheduler.http import probe_app
from hami.scheduler.service import Scheduler


def long_uuids(nodes: int, seed: int) -> dict[str, str]:
    """bench_filter's short uuid -> a real-length one (GPU-8-4-4-4-12 hex)."""
    rng = random.Random(seed)
    return {
        f"GPU-{n:05d}-{d}": f"GPU-{uuid.UUID(int=rng.getrandbits(128))}"
        for n in range(nodes)
        for d in range(bench_filter.DEVICES)
    }


class RealUuids:
    """Wraps a Scheduler so bench_filter.build's objects carry real-length uuids."""

    def __init__(self, scheduler: Scheduler, names: dict[str, str]) -> None:
        self.scheduler, self.names = scheduler, names

    def _swap(self, obj: dict[str, Any]) -> dict[str, Any]:
        annotations = obj["metadata"].get("annotations", {})
        for key, value in annotations.items():
            if key.endswith("-register") or key.endswith("devices-allocated"):
                for short in set(_shorts(value)):
                    value = value.replace(short + ",", self.names[short] + ",")
                annotations[key] = value
        return obj

    def on_node(self, kind: str, obj: dict[str, Any]) -> None:
        self.scheduler.on_node(kind, self._swap(obj))

    def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        self.scheduler.on_pod(kind, self._swap(obj))


def _shorts(value: str) -> list[str]:
    return [
        part for part in value.replace(";", ",").replace(":", ",").split(",") if part[:4] == "GPU-"
    ]


async def lateness_probe(samples: list[float], stop: asyncio.Event) -> None:
    TASK.set("probe")
    while not stop.is_set():
        began = time.perf_counter()
        await asyncio.sleep(0.001)
        samples.append(time.perf_counter() - began - 0.001)


async def filter_loop(
    scheduler: Scheduler, names: list[str], out: list[tuple[float, float]], stop: asyncio.Event
) -> None:
    TASK.set("filter")
    shapes = bench_filter.request_pods()
    rng = random.Random(7)
    while not stop.is_set():
        shape = rng.choice(shapes)
        began, began_cpu = time.perf_counter(), time.thread_time()
        await scheduler.filter({"Pod": shape, "NodeNames": names})
        out.append((time.perf_counter() - began, time.thread_time() - began_cpu))
        # Release the reservation: the node changes again, so the next scrape re-renders it.
        scheduler.cluster.release(f"bench/{shape['metadata']['name']}")
        await asyncio.sleep(0.002)


async def scrape(port: int, gzip: bool) -> tuple[int, float]:
    """(bytes on the wire, seconds) of one scrape by curl; gzip as Prometheus asks."""
    proc = await asyncio.create_subprocess_exec(
        "curl",
        "-s",
        *(["--compressed"] if gzip else []),
        "-o",
        "/dev/null",
        "-w",
        "%{size_download} %{time_total}",
        f"http://127.0.0.1:{port}/metrics",
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    size, seconds = out.decode().split()
    return int(size), float(seconds)


# Which bench task a loop step belongs to; steps of neither are the scrape's (its
# handler, its writes, its worker-thread wake-ups).
TASK: contextvars.ContextVar[str] = contextvars.ContextVar("bench_task", default="scrape")


class LongestStep:
    """The longest single step the event loop ran for the scrape (one callback or task
    step), in CPU time of the loop's thread: what the scrape's own work holds the loop
    for, whatever else the machine runs. (The lateness probe sees wall time: also the
    time the OS gave to other processes, which a shared machine's figures are full of.)"""

    def __init__(self) -> None:
        self.longest = 0.0
        original = asyncio.events.Handle._run
        probe = self

        def run(handle: asyncio.events.Handle) -> None:
            began = time.thread_time()
            original(handle)
            spent = time.thread_time() - began
            context = getattr(handle, "_context", None)
            owner = context.get(TASK, "scrape") if context is not None else "scrape"
            if owner == "scrape" and spent > probe.longest:
                probe.longest = spent

        asyncio.events.Handle._run = run  # type: ignore[method-assign,assignment]

    def clear(self) -> None:
        self.longest = 0.0


class GcPauses:
    """The longest garbage collection pause since ``clear``: a stall of the whole
    process that a scrape's allocations may trigger but that is not the scrape's work."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.longest = max(self.longest, time.perf_counter() - self._began)

    def clear(self) -> None:
        self.longest = 0.0


async def run(nodes: int, scrapes: int, seed: int) -> None:
    cfg = config.from_mapping({}, env={})
    scheduler = Scheduler(cfg.scheduler, [bench_filter.KIND], None, emit_events=False)
    began = time.perf_counter()
    pods = bench_filter.build(RealUuids(scheduler, long_uuids(nodes, seed)), nodes, seed)  # type: ignore[arg-type]
    gc.collect()
    print(
        f"== {nodes} nodes x {bench_filter.DEVICES} devices, {pods} running pods "
        f"(built in {time.perf_counter() - began:.1f}s), rss {bench_filter.rss_mib():.0f} MiB"
    )
    scheduler.nodes_synced.set()
    scheduler.pods_synced.set()

    class NoApi:
        async def patch_pod_annotations(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return {}

    scheduler.kube = NoApi()  # type: ignore[assignment]
    runner = web.AppRunner(probe_app(scheduler))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    names = sorted(scheduler.cluster.nodes)
    pauses = GcPauses()
    steps = LongestStep()
    try:
        for round_ in range(scrapes):
            stop = asyncio.Event()
            late: list[float] = []
            filters: list[tuple[float, float]] = []
            tasks = [
                asyncio.create_task(lateness_probe(late, stop)),
                asyncio.create_task(filter_loop(scheduler, names, filters, stop)),
            ]
            await asyncio.sleep(0.2)  # filters change nodes before the scrape
            late.clear()
            filters.clear()
            pauses.clear()
            steps.clear()
            gzip = round_ % 2 == 1
            size, seconds = await scrape(port, gzip)
            stop.set()
            await asyncio.gather(*tasks)
            what = ("cold" if round_ == 0 else "warm") + (", gzip" if gzip else "")
            print(
                f"  scrape {round_ + 1} ({what}): {size / 1e6:.1f} MB in {seconds:.2f}s; "
                f"longest scrape step {steps.longest * 1000:.1f} ms cpu, "
                f"longest loop stall {max(late, default=0) * 1000:.1f} ms "
                f"(longest gc pause {pauses.longest * 1000:.1f} ms), "
                f"{len(filters)} filter calls during it, "
                f"slowest {max((w for w, _ in filters), default=0) * 1000:.1f} ms "
                f"({max((c for _, c in filters), default=0) * 1000:.1f} ms cpu)"
            )
        gc.collect()
        print(
            f"  rss {bench_filter.rss_mib():.0f} MiB after the scrapes "
            f"(kept text {_kept_mib(scheduler):.0f} MiB)"
        )
    finally:
        scheduler.kube = None
        await runner.cleanup()


def _kept_mib(scheduler: Scheduler) -> float:
    text = scheduler.metrics.cluster_text
    kept = list(text.nodes.values()) + list(text.pods.values())
    return sum(len(part) for parts in kept for part in parts) / (1 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[1000, 5000])
    parser.add_argument("--scrapes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    log.configure("warning", "console", stream=sys.stderr)
    for nodes in args.nodes:
        asyncio.run(run(nodes, args.scrapes, args.seed))


if __name__ == "__main__":
    main()
