"""The one-node parts of bench_e2e (extender mode) and bench_dra (DRA mode): what each
extra pod on one node costs, timed from watch events.

A repetition places one pod alone, then N pods created at once, on a ``LocalCluster`` of
one node (node agent, kubelet emulator). Watches started before the pods are created
(the namespace's pods, the node, and in DRA mode the namespace's ResourceClaims) stamp
every step with ``time.perf_counter()`` when its event arrives, so nothing is rounded to
a poll period. Per pod:

- ``locked``: the node's ``hami.io/mutex.lock`` names the pod (extender mode);
- ``allocating``: the pod carries ``bind-phase: allocating`` (the bind's decision write);
- ``claimed`` / ``allocated``: its ResourceClaim exists / has an allocation (DRA mode);
- ``bound``: ``spec.nodeName`` is set (the Binding);
- ``success``: ``bind-phase: success`` (the node agent's write after the last Allocate);
- ``running``: ``status.phase: Running`` (the kubelet emulator's status write);
- ``released``: the node's lock stopped naming the pod (the node agent's release).

Figures: one pod alone (creation to Running), the N pods' first and last Running, the
marginal cost of each extra pod, (last - first) / (N - 1), the spacing between
consecutive Running events (p50 / p90 / max), and for the extra pods the median time
between the steps above (the serial chain each extra pod waits on). A benchmark, not a
test: it prints figures and never fails on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from _e2e_common import load, say

from hami.kube.client import Kube, pods_path
from hami.kube.raw import KubeError
from hami.protocol import keys, parse_lock

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
#: the steps of the extender mode's chain, in order: (from, to, what it covers)
EXTENDER_CHAIN: tuple[tuple[str, str, str], ...] = (
    (
        "prev.released",
        "locked",
        "previous release -> lock taken (scheduler's Node watch, lock write)",
    ),
    # the decision is written before the bind waits for its turn (docs/scheduler.md)
    ("allocating", "locked", "decision written -> lock taken (turn and lock wait)"),
    ("locked", "bound", "lock -> Binding (check, Binding write)"),
    ("bound", "success", "Binding -> agent's write (kubelet's watch, Allocate, pod write)"),
    ("success", "released", "agent's write -> lock released (Node write)"),
    ("success", "running", "agent's write -> Running (kubelet's status write)"),
    ("prev.locked", "locked", "one lock cycle (previous lock -> this lock)"),
)
#: the DRA mode's steps (no node lock: pods of one node may overlap)
DRA_CHAIN: tuple[tuple[str, str, str], ...] = (
    ("created", "claimed", "pod -> claim made (resourceclaim controller)"),
    ("claimed", "allocated", "claim -> allocated (kube-scheduler)"),
    ("allocated", "bound", "allocation -> Binding (kube-scheduler)"),
    ("bound", "running", "Binding -> Running (kubelet: prepare, status write)"),
    ("prev.allocated", "allocated", "one allocation after the previous"),
)


@dataclass
class Timeline:
    """First-seen times (``perf_counter``) of each pod's steps, from watches."""

    marks: dict[str, dict[str, float]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    lock_owner: str = ""  # the pod the node's lock names now, as watched

    def mark(self, pod: str, step: str, when: float) -> None:
        steps = self.marks.setdefault(pod, {})
        if step not in steps:
            steps[step] = when
            self.changed.set()

    def on_pod(self, kind: str, pod: dict[str, Any], when: float) -> None:
        meta = pod.get("metadata") or {}
        name = str(meta.get("name") or "")
        if kind == "ADDED":
            self.mark(name, "created", when)
        phase = (meta.get("annotations") or {}).get(keys.BIND_PHASE)
        if phase in ("allocating", "success"):
            self.mark(name, phase, when)
        if (pod.get("spec") or {}).get("nodeName"):
            self.mark(name, "bound", when)
        if (pod.get("status") or {}).get("phase") == "Running":
            self.mark(name, "running", when)

    def on_node(self, node: dict[str, Any], when: float) -> None:
        value = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_LOCK)
        lock = parse_lock(value)
        owner = lock.pod if lock is not None and lock.owner is not None else ""
        if owner == self.lock_owner:
            return
        if self.lock_owner:
            self.mark(self.lock_owner, "released", when)
        if owner:
            self.mark(owner, "locked", when)
        self.lock_owner = owner

    def on_claim(self, claim: dict[str, Any], when: float) -> None:
        owners = (claim.get("metadata") or {}).get("ownerReferences") or []
        pods = [str(o.get("name")) for o in owners if o.get("kind") == "Pod"]
        for pod in pods:
            self.mark(pod, "claimed", when)
            if (claim.get("status") or {}).get("allocation"):
                self.mark(pod, "allocated", when)

    async def wait(self, names: Sequence[str], step: str, timeout: float) -> bool:  # noqa: ASYNC109
        """Until every named pod reached ``step`` (False after ``timeout`` seconds)."""
        deadline = time.perf_counter() + timeout
        while not all(step in self.marks.get(n, {}) for n in names):
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))
        return True


async def follow(
    kube: Kube, path: str, query: list[tuple[str, str]], handle: Callable[[str, Any, float], None]
) -> None:
    """List ``path`` for a resourceVersion, then watch it from there (reconnecting from the
    last version seen); each event goes to ``handle(kind, object, arrival time)``."""
    _items, version = await kube.list_all(path, query=query)
    while True:
        watch = [*query, ("watch", "1"), ("resourceVersion", version)]
        try:
            async with kube.stream(path, query=watch) as events:
                async for event in events:
                    when = time.perf_counter()
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    version = str(meta.get("resourceVersion") or version)
                    handle(str(event.get("type")), obj, when)
        except (TimeoutError, KubeError, ValueError, OSError):
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def watching(kube: Kube, namespace: str, node: str, claims: bool) -> AsyncIterator[Timeline]:
    """A ``Timeline`` fed by watches of the namespace's pods, the node and (``claims``)
    the namespace's ResourceClaims, for the body of the ``async with``."""
    timeline = Timeline()
    tasks = [
        asyncio.create_task(
            follow(kube, pods_path(namespace), [], lambda k, o, w: timeline.on_pod(k, o, w))
        ),
        asyncio.create_task(
            follow(
                kube,
                "/api/v1/nodes",
                [("fieldSelector", f"metadata.name={node}")],
                lambda _k, o, w: timeline.on_node(o, w),
            )
        ),
    ]
    if claims:
        tasks.append(
            asyncio.create_task(
                follow(
                    kube,
                    CLAIMS.format(namespace=namespace),
                    [],
                    lambda _k, o, w: timeline.on_claim(o, w),
                )
            )
        )
    await asyncio.sleep(0.5)  # the lists are done and the watches open before any pod
    try:
        yield timeline
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Burst:
    """Pods created at once: each one's steps, in seconds after the first create."""

    names: list[str]
    steps: dict[str, dict[str, float]]
    complete: bool

    def running(self) -> list[float]:
        return sorted(self.steps[n]["running"] for n in self.names if "running" in self.steps[n])

    def order(self) -> list[str]:
        """The pods in the order they were Running."""
        done = [n for n in self.names if "running" in self.steps[n]]
        return sorted(done, key=lambda n: self.steps[n]["running"])


async def burst(
    cluster: Any,
    timeline: Timeline,
    tag: str,
    count: int,
    make_pod: Callable[[str], dict[str, Any]],
) -> Burst:
    """Create ``count`` pods at once and wait (by the watches) until all are Running;
    then delete them (untimed)."""
    names = [f"{tag}-{i}" for i in range(count)]
    began = time.perf_counter()
    await asyncio.gather(*(cluster.create_pod(make_pod(n)) for n in names))
    complete = await timeline.wait(names, "running", timeout=120.0)
    steps = {
        n: {step: when - began for step, when in timeline.marks.get(n, {}).items()} for n in names
    }
    if not complete:
        say(f"  !! {tag}: not every pod was Running within 120 s")
    await cluster.delete_pods(wait=True)
    return Burst(names, steps, complete)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def spacing(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def marginal(many: Burst) -> float:
    running = many.running()
    if len(running) < 2:
        return float("nan")
    return (running[-1] - running[0]) / (len(running) - 1)


def chain(many: Burst, steps: Sequence[tuple[str, str, str]]) -> list[tuple[str, float, int]]:
    """For the extra pods (all but the first Running), the median time of each step
    (``prev.`` names the step of the pod Running just before): (what, median s, pods)."""
    order = many.order()
    out: list[tuple[str, float, int]] = []
    for start, end, what in steps:
        samples: list[float] = []
        for before, pod in itertools.pairwise(order):
            source = many.steps[before] if start.startswith("prev.") else many.steps[pod]
            first = source.get(start.removeprefix("prev."))
            last = many.steps[pod].get(end)
            if first is not None and last is not None:
                samples.append(last - first)
        out.append((what, statistics.median(samples) if samples else float("nan"), len(samples)))
    return out


def report(rep: int, one: Burst, many: Burst, steps: Sequence[tuple[str, str, str]]) -> None:
    alone = one.running()[0] if one.running() else float("nan")
    running = many.running()
    gaps = spacing(running)
    first = running[0] if running else float("nan")
    last = running[-1] if running else float("nan")
    say(
        f"  rep {rep + 1}: 1 pod {alone * 1000:6.1f} ms; {len(many.names)} pods: first "
        f"{first * 1000:6.1f} ms, last {last * 1000:6.1f} ms ({last / alone:4.1f}x one pod); "
        f"per extra pod {marginal(many) * 1000:5.1f} ms, spacing p50 {pct(gaps, 0.5) * 1000:5.1f}"
        f" / p90 {pct(gaps, 0.9) * 1000:5.1f} / max {max(gaps, default=float('nan')) * 1000:5.1f}"
        f" ms  ({load()})"
    )
    for what, median, pods in chain(many, steps):
        say(f"      {what}: median {median * 1000:6.1f} ms (n={pods})")


def summary(results: list[tuple[Burst, Burst]]) -> None:
    alone = [one.running()[0] for one, _ in results if one.running()]
    extra = [marginal(many) for _, many in results]
    lasts = [many.running()[-1] for _, many in results if many.running()]
    gaps = [gap for _, many in results for gap in spacing(many.running())]
    say(
        f"  summary over {len(results)} reps: 1 pod {_span(alone)}; last of the burst "
        f"{_span(lasts)}; per extra pod {_span(extra)} (median "
        f"{statistics.median(extra) * 1000:.1f} ms); spacing p50 / p90 "
        f"{pct(gaps, 0.5) * 1000:.1f} / {pct(gaps, 0.9) * 1000:.1f} ms  ({load()})"
    )


def _span(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{min(values) * 1000:.0f}-{max(values) * 1000:.0f} ms"


async def one_node(
    cluster: Any,
    node: str,
    reps: int,
    count: int,
    make_pod: Callable[[str], dict[str, Any]],
    dra: bool = False,
) -> None:
    """Per repetition: one pod alone, then ``count`` at once; printed as they come, then
    a summary (``cluster`` is a ``LocalCluster``)."""
    steps = DRA_CHAIN if dra else EXTENDER_CHAIN
    results: list[tuple[Burst, Burst]] = []
    async with watching(cluster.kube, cluster.namespace, node, claims=dra) as timeline:
        for rep in range(reps):
            one = await burst(cluster, timeline, f"one{rep}", 1, make_pod)
            many = await burst(cluster, timeline, f"many{rep}", count, make_pod)
            report(rep, one, many, steps)
            results.append((one, many))
    summary(results)
