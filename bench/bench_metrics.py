"""Time a ``/metrics`` scrape of the scheduler role on a synthetic cluster, and how much it
delays the event loop (and the filter calls) while it runs.

    .venv/bin/python bench/bench_metrics.py                  # 1000 and 5000 nodes
    .venv/bin/python bench/bench_metrics.py --nodes 5000 65000  # issue 20 item 3's rows

Each cluster has N nodes x 8 devices with real-length GPU UUIDs, and running pods on
about half of the devices (``bench_filter.build``'s shapes). The scheduler's probe app
serves ``/metrics`` on a local port; ``curl`` (another process) scrapes it, so the
client's reading is not counted against the scheduler's loop. Meanwhile two tasks run on
the scheduler's loop: a probe that sleeps 1 ms in a loop and records how late it wakes
(the longest stall of the loop), and a filter loop calling ``Scheduler.filter`` (the pod
patch stubbed out) whose reservations change a node between scrapes, as placements do.

Figures per scrape: bytes, seconds (curl's total), the longest single step of the loop
(what the scrape's own work holds it for), the longest loop stall (as the probe sees it:
also time the OS gave to other processes), the longest garbage collection pause, and the
filter calls answered during the scrape (p50 / p99 / max). The first scrape renders every
node (a cold cache); the next ones only what changed since, alternately plain and gzip;
the last two ("unchanged") run while the filter loop asks for a pod no node can take, so
no node changes between them and a scrape may be answered from what the previous one
built. A "no scrape" line first gives the same figures without any scrape, to compare.
The collector is tuned as the role tunes it once its initial lists are in
(``hami.scheduler.heap.settle``: what exists is frozen, young passes every 10,000
allocations); ``--no-tune`` leaves CPython's defaults, as this benchmark ran before.
A benchmark, not a test: it never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextvars
import gc
import os
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
from hami.scheduler import heap
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


HELD = 64  # reservations the filter loop keeps at a time


def unplaceable_pod() -> dict[str, Any]:
    """A pod no node can take (more memory than any device): its filter calls change no
    node, as kube-scheduler retrying a pending pod."""
    return {
        "metadata": {"name": "too-big", "namespace": "bench", "uid": "too-big"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "999999"}},
                }
            ]
        },
    }


async def filter_loop(
    scheduler: Scheduler,
    names: list[str],
    out: list[tuple[float, float]],
    stop: asyncio.Event,
    *,
    changing: bool = True,
) -> None:
    TASK.set("filter")
    shapes = bench_filter.request_pods() if changing else [unplaceable_pod()]
    rng = random.Random(7)
    held: collections.deque[str] = collections.deque()
    calls = 0
    while not stop.is_set():
        calls += 1
        shape = rng.choice(shapes)
        name = f"{shape['metadata']['name']}-{calls}"  # a pod of its own each call
        pod = {**shape, "metadata": {**shape["metadata"], "name": name, "uid": name}}
        began, began_cpu = time.perf_counter(), time.thread_time()
        await scheduler.filter({"Pod": pod, "NodeNames": names})
        out.append((time.perf_counter() - began, time.thread_time() - began_cpu))
        # The last HELD reservations stay, the oldest is released: nodes keep changing
        # (a release right away would leave every node as it was at the next scrape).
        held.append(f"bench/{name}")
        if len(held) > HELD:
            scheduler.cluster.release(held.popleft())
        await asyncio.sleep(0.002)
    for key in held:
        scheduler.cluster.release(key)


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
        self.total = 0.0  # every step of the scrape: the loop's CPU it took in all
        self.what = ""  # the longest step's callback, with --steps
        original = asyncio.events.Handle._run
        probe = self

        def run(handle: asyncio.events.Handle) -> None:
            began = time.thread_time()
            original(handle)
            spent = time.thread_time() - began
            context = getattr(handle, "_context", None)
            owner = context.get(TASK, "scrape") if context is not None else "scrape"
            if owner == "scrape":
                probe.total += spent
            if owner == "scrape" and spent > probe.longest:
                probe.longest = spent
                probe.what = _step_name(handle)

        asyncio.events.Handle._run = run  # type: ignore[method-assign,assignment]

    def clear(self) -> None:
        self.longest = self.total = 0.0
        self.what = ""


def _step_name(handle: asyncio.events.Handle) -> str:
    """A task step as the coroutine where it stopped (innermost await), else the handle."""
    task = getattr(getattr(handle, "_callback", None), "__self__", None)
    if not isinstance(task, asyncio.Task):
        return repr(handle)[:160]
    coro: Any = task.get_coro()
    names = []
    while coro is not None and hasattr(coro, "cr_frame"):
        frame = coro.cr_frame
        names.append(f"{coro.__qualname__}:{frame.f_lineno if frame else '-'}")
        coro = coro.cr_await
    return " > ".join(names)


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


async def run(
    nodes: int, scrapes: int, seed: int, show_steps: bool = False, tune: bool = True
) -> None:
    cfg = config.from_mapping({}, env={})
    scheduler = Scheduler(cfg.scheduler, [bench_filter.KIND], None, emit_events=False)
    began = time.perf_counter()
    pods = bench_filter.build(RealUuids(scheduler, long_uuids(nodes, seed)), nodes, seed)  # type: ignore[arg-type]
    gc.collect()
    if tune:
        heap.settle()  # as the role does once both initial lists are in
    print(
        f"== {nodes} nodes x {bench_filter.DEVICES} devices, {pods} running pods "
        f"(built in {time.perf_counter() - began:.1f}s), rss {bench_filter.rss_mib():.0f} MiB, "
        f"collector {'tuned as the role' if tune else 'CPython defaults'}, load {_load()}"
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
    # (label, gzip or None for no scrape, filter calls change nodes)
    rounds: list[tuple[str, bool | None, bool]] = [("no scrape", None, True)]
    for round_ in range(scrapes):
        packed = round_ % 2 == 1
        rounds.append(
            (("cold" if round_ == 0 else "changed") + (", gzip" if packed else ""), packed, True)
        )
    rounds += [("unchanged, gzip", True, False), ("unchanged, gzip", True, False)]
    rounds += [("unchanged", False, False), ("unchanged", False, False)]
    try:
        for number, (what, gzip, changing) in enumerate(rounds):
            stop = asyncio.Event()
            late: list[float] = []
            filters: list[tuple[float, float]] = []
            tasks = [
                asyncio.create_task(lateness_probe(late, stop)),
                asyncio.create_task(
                    filter_loop(scheduler, names, filters, stop, changing=changing)
                ),
            ]
            await asyncio.sleep(0.2)  # filters change nodes before the scrape
            late.clear()
            filters.clear()
            pauses.clear()
            steps.clear()
            if gzip is None:
                await asyncio.sleep(1.0)
                head = f"  {what} (1 s)"
            else:
                kept = _kept_body(scheduler, gzip)
                size, seconds = await scrape(port, gzip)
                how = (
                    "kept" if kept is not None and kept is _kept_body(scheduler, gzip) else "built"
                )
                head = (
                    f"  scrape {number} ({what}, body {how}): {size / 1e6:.1f} MB in {seconds:.2f}s"
                )
            stop.set()
            await asyncio.gather(*tasks)
            walls = [w * 1000 for w, _ in filters] or [0.0]
            print(
                f"{head}; longest scrape step {steps.longest * 1000:.1f} ms cpu "
                f"(all its steps {steps.total * 1000:.0f} ms), "
                f"longest loop stall {max(late, default=0) * 1000:.1f} ms "
                f"(longest gc pause {pauses.longest * 1000:.1f} ms), "
                f"{len(filters)} filter calls: p50 {bench_filter.percentile(walls, 0.5):.1f} / "
                f"p99 {bench_filter.percentile(walls, 0.99):.1f} / max {max(walls):.1f} ms "
                f"(slowest {max((c for _, c in filters), default=0) * 1000:.1f} ms cpu)"
            )
            if show_steps and gzip is not None:
                print(f"    longest scrape step: {steps.what}")
        gc.collect()
        print(
            f"  rss {bench_filter.rss_mib():.0f} MiB after the scrapes "
            f"(kept text {_kept_mib(scheduler):.0f} MiB), load {_load()}"
        )
    finally:
        scheduler.kube = None
        await runner.cleanup()


def _kept_body(scheduler: Scheduler, gzip: bool) -> object:
    """The body the metrics keep between changes (None before it kept any)."""
    text = scheduler.metrics.cluster_text
    return getattr(text, "_packed" if gzip else "_plain", None)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _kept_mib(scheduler: Scheduler) -> float:
    text = scheduler.metrics.cluster_text
    kept = list(text.nodes.values()) + list(text.pods.values())
    return sum(len(part) for parts in kept for part in parts) / (1 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[1000, 5000])
    parser.add_argument("--scrapes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", action="store_true", help="name each longest scrape step")
    parser.add_argument(
        "--no-tune", action="store_true", help="CPython's collector defaults (no heap.settle)"
    )
    args = parser.parse_args()
    log.configure("warning", "console", stream=sys.stderr)
    for nodes in args.nodes:
        asyncio.run(run(nodes, args.scrapes, args.seed, args.steps, not args.no_tune))


if __name__ == "__main__":
    main()
