"""Issue 19 item 4: the staged migration of docs/migration.md, run on the real control plane
against Go HAMi's own scheduler (the ``make interop`` tier: it needs ``HAMI_SRC`` or
``HAMI_GO_SCHEDULER``, otherwise it is skipped with one line, as tests/test_interop_go.py).

The cluster: three simulated nodes of 2 x A100 (40960 MiB, split 10). Nodes ``mig-a`` and
``mig-b`` start "on Go's device plugin": that plugin needs NVML, so a stand-in annotates the
Node exactly as Go HAMi 2.10's NVIDIA plugin does (the JSON register value alone: no
heartbeat key, no ``Reported_``), while kubelet's ``Allocate`` is answered from the pod's
decision as Go's plugin would. ``mig-c`` runs this project's node agent with
``register_format: json`` from the start.

One test walks the stages, checking the same invariants after each:

    0   Go's scheduler places six 30000 MiB pods (one per device: 10960 MiB left on each)
    1   Go's scheduler stopped; this project's scheduler role on the same extender URL
    1R  rollback of stage 1: Go's scheduler again
    2   mig-a: Go's plugin -> this node agent, while Go's scheduler runs;
        stage 1 again; mig-b: Go's plugin -> this node agent under this scheduler
    2R  rollback of stage 2 for mig-b (back on Go's plugin), then forward again
    3   every agent back to the default register form (seed)

Invariants: every pod placed before is still Running where it was, on the same devices (its
decision unchanged, the kubelet emulator still running it); no node drops out (sampled every
half second the whole time a scheduler runs, the node being moved excused only while it
moves); a pod pinned to each node places and starts; a 12000 MiB probe, which fits a device
only if that device's pods were forgotten, is refused; what the pods' decisions hold and
what the ``Allocate`` answers gave stay within every device's register value, and agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _cluster_checks import answered_holds, holds
from _gohami import REGISTER_KEY, GoHamiCluster, go_scheduler_binary, go_version, skip_reason

from hami import log
from hami.backends.fake import FakeBackend
from hami.kube.objects import annotations_of
from hami.protocol import decode_node_devices, keys, register
from hami.protocol.register import NodeDevice, encode_node_devices_json
from hami.testkit.cluster import ALLOCATED, NodeSpec, Timing, gpu_pod, limits, phase_of, poll
from hami.testkit.controlplane import ControlPlane

_why = skip_reason()
pytestmark = [
    pytest.mark.skipif(_why is not None, reason=_why or ""),
    pytest.mark.controlplane,
    pytest.mark.asyncio(loop_scope="module"),
    # may build Go HAMi's scheduler first (minutes on 2 cores); the walk itself takes minutes
    pytest.mark.timeout(1800),
]

A, B, C = "mig-a", "mig-b", "mig-c"
A100 = {"count": 2, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960}
NODES = tuple(NodeSpec(name, (A100,)) for name in (A, B, C))
GO_PLUGIN = (A, B)  # the nodes that start on (a stand-in for) Go's device plugin
TIMING = Timing(register_period=2.0)
BIG, SMALL, PROBE = 30000, 1000, 12000  # MiB: BIG + PROBE > 40960, BIG + 9 * SMALL < it
HOSTNAME = "kubernetes.io/hostname"


class GoPluginStandIn(FakeBackend):
    """Writes the Node annotations of Go HAMi 2.10's NVIDIA device plugin: the JSON register
    value (its MarshalNodeDevices form, byte-exact per the Go vectors) and nothing else."""

    def registration(self, node_devices: Sequence[NodeDevice], now: datetime) -> dict[str, str]:
        return {self.register_key: encode_node_devices_json(node_devices)}

    @property
    def handshake_key(self) -> str:
        # the agent's debug line for a repeated write names this key's value; Go's plugin
        # writes no heartbeat, so the register key stands in
        return self.register_key


class MigrationCluster(GoHamiCluster):
    """Go HAMi's scheduler or this project's scheduler role behind one extender URL, and
    nodes whose device plugin can be swapped while kubelet keeps running their pods."""

    def __init__(self, binary: Path, *, plane: ControlPlane) -> None:
        super().__init__(NODES, binary, plane=plane, timing=TIMING)
        # this project's role listens where kube-scheduler's extender config points at Go
        self.port = self.go_port
        self.cfg = self._config("binpack", "spread")
        for name in GO_PLUGIN:
            self.nodes[name].backend = self.backend(name, "go-plugin")

    def backend(self, node: str, kind: str) -> FakeBackend:
        """``go-plugin`` (the stand-in), or this node agent with register form ``json`` or
        ``seed``; the same devices (uuids) either way, as on a real node."""
        settings = self.nodes[node].backend.settings
        if kind == "go-plugin":
            return GoPluginStandIn(dataclasses.replace(settings, register_format=register.JSON))
        return FakeBackend(dataclasses.replace(settings, register_format=kind))

    @property
    def scheduler(self) -> str:
        return "go" if self.go is not None else "hami" if self.role is not None else "none"

    async def use_hami(self) -> None:
        """Stage 1: stop Go's scheduler, start this project's role on its URL."""
        if self.go is not None:
            go, self.go = self.go, None
            await asyncio.to_thread(go.stop)
        await self.start_role()
        await self.wait_available(self.nodes, True)

    async def use_go(self) -> None:
        """Rollback of stage 1: stop this project's role, start Go's scheduler again."""
        await self.stop_role()
        await asyncio.to_thread(self._start_go)
        await self.wait_go_sees(self.nodes)

    async def move(self, node: str, kind: str) -> None:
        """Replace the node's device plugin (DaemonSet pod) by another; kubelet and its pods
        stay. Returns once kubelet advertises the devices again and the scheduler holds the
        node."""
        sim = self.nodes[node]
        await sim.stop_agent()
        sim.backend = self.backend(node, kind)
        await sim.start_agent()
        if self.go is not None:
            await self.wait_go_sees([node])
        else:
            await self.wait_available([node], True)

    async def offered(self) -> set[str] | None:
        """The nodes the running scheduler would offer now (None: none runs)."""
        if self.role is not None:
            return {n for n in self.nodes if self.available(n)}
        if self.go is not None:
            held = await self.go_devices()
            return {n for n, sim in self.nodes.items() if set(sim.uuids) <= held.get(n, set())}
        return None

    async def registered_from_nodes(self) -> dict[str, tuple[int, int, int]]:
        """uuid -> (split count, MiB, cores) from the Nodes' register values (read by
        neither scheduler, so the same check holds under both)."""
        out: dict[str, tuple[int, int, int]] = {}
        for name in self.nodes:
            value = await self.register_value(name)
            for d in decode_node_devices(value):
                out[d.uuid] = (d.count, d.memory, d.cores)
        return out


class DropWatch:
    """Samples which nodes the running scheduler offers; any node missing that is not
    excused (between schedulers, or the node being moved) is a drop."""

    def __init__(self, cluster: MigrationCluster) -> None:
        self.cluster = cluster
        self.excused: set[str] = set()
        self.drops: list[str] = []
        # (node, scheduler) -> [first, last] seconds of each gap while excused: reported only
        self.excused_drops: dict[tuple[str, str], list[list[float]]] = {}
        self.samples = 0

    @contextlib.contextmanager
    def excuse(self, nodes: Sequence[str]) -> Iterator[None]:
        self.excused |= set(nodes)
        try:
            yield
        finally:
            self.excused -= set(nodes)

    async def run(self) -> None:
        began = time.monotonic()
        while True:
            excused = set(self.excused)
            seen = await self.cluster.offered()
            if seen is not None:
                self.samples += 1
                t = time.monotonic() - began
                for name in sorted(set(self.cluster.nodes) - seen):
                    if name in excused or name in self.excused:
                        gap = self.excused_drops.setdefault((name, self.cluster.scheduler), [])
                        if gap and t - gap[-1][1] < 1.0:
                            gap[-1][1] = t  # the same gap, one sample later
                        else:
                            gap.append([t, t])
                    else:
                        sched = self.cluster.scheduler
                        self.drops.append(f"{name} not offered by {sched} at {t:.1f}s")
            await asyncio.sleep(0.5)

    def gaps(self) -> str:
        """The excused gaps, e.g. ``mig-b under hami 72.8-74.3s``."""
        return ", ".join(
            f"{node} under {sched} {a:.1f}-{b:.1f}s"
            for (node, sched), gaps in sorted(self.excused_drops.items())
            for a, b in gaps
        )


@dataclasses.dataclass
class Placed:
    node: str
    uid: str
    decision: str
    stage: str


class Walk:
    """The pods placed so far and the checks run after every step."""

    def __init__(self, cluster: MigrationCluster, watch: DropWatch) -> None:
        self.cluster = cluster
        self.watch = watch
        self.placed: dict[str, Placed] = {}
        self.report: list[str] = []

    async def place(self, stage: str, pods: Mapping[str, dict[str, Any]]) -> None:
        for pod in pods.values():
            await self.cluster.create_pod(pod)
        try:
            started = await self.cluster.wait_running(pods, timeout=150)
        except TimeoutError as exc:
            raise AssertionError(f"{stage}: {exc}\n{self.cluster.diagnosis()}") from None
        for name, pod in started.items():
            assert phase_of(pod) == "Running", (stage, name, pod.get("status"))
            admission = await self.cluster.admission(pod)
            assert admission.phase == "Running", (stage, name, admission.message)
            self.placed[name] = Placed(
                pod["spec"]["nodeName"],
                pod["metadata"]["uid"],
                annotations_of(pod).get(ALLOCATED, ""),
                stage,
            )
            assert self.placed[name].decision, (stage, name, annotations_of(pod))

    async def check(self, stage: str) -> None:
        """The invariants of every stage (module docstring)."""
        began = time.monotonic()
        cluster = self.cluster
        # pods placed before: still Running, where and on what they were placed
        pods = {p["metadata"]["name"]: p for p in await cluster.list_pods()}
        for name, was in self.placed.items():
            pod = pods.get(name)
            assert pod is not None, f"{stage}: {name} (placed at {was.stage}) is gone"
            assert phase_of(pod) == "Running", (stage, name, pod.get("status"))
            assert pod["metadata"]["uid"] == was.uid, (stage, name)
            assert pod["spec"]["nodeName"] == was.node, (stage, name)
            assert annotations_of(pod).get(ALLOCATED) == was.decision, (stage, name)
            admission = await cluster.admission(pod)
            assert admission.phase == "Running" and not admission.deleted, (stage, name)
        # a request that fits a device only if its pods are forgotten is refused
        await self.probe(stage)
        # every node takes a new pod
        pinned = {
            f"{stage}-{node}": gpu_pod(
                f"{stage}-{node}", [limits(1, mem=SMALL)], node_selector={HOSTNAME: node}
            )
            for node in cluster.nodes
        }
        await self.place(stage, pinned)
        await self.within_devices(stage)
        if cluster.role is not None:
            # a node this scheduler times out drops within 2 handshake timeouts: watch that long
            wait = 2 * TIMING.handshake_timeout + TIMING.handshake_period
            await asyncio.sleep(max(0.0, wait - (time.monotonic() - began)))
        assert self.watch.drops == [], f"{stage}: nodes dropped out: {self.watch.drops}"
        self.report.append(
            f"{stage}: scheduler={cluster.scheduler} pods={len(self.placed)} "
            f"checked in {time.monotonic() - began:.1f}s"
        )

    async def probe(self, stage: str) -> None:
        name = f"{stage}-probe"
        await self.cluster.create_pod(gpu_pod(name, [limits(1, mem=PROBE)]))

        def refused(pod: dict[str, Any]) -> bool:
            conditions = (pod.get("status") or {}).get("conditions") or []
            return bool(pod["spec"].get("nodeName")) or any(
                c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions
            )

        try:
            pod = await self.cluster.wait_pod(name, refused, timeout=60)
        finally:
            await self.cluster.delete_pod(name)
        assert not pod["spec"].get("nodeName"), (
            f"{stage}: the {PROBE} MiB probe was placed on {pod['spec'].get('nodeName')}: "
            f"{annotations_of(pod).get(ALLOCATED)}"
        )

        async def gone() -> bool:
            return name not in {p["metadata"]["name"] for p in await self.cluster.list_pods()}

        await poll(gone, 30, f"{name} deleted")

    async def within_devices(self, stage: str) -> None:
        registered = await self.cluster.registered_from_nodes()
        assert len(registered) == sum(s.device_count for s in NODES), registered
        pods = {
            p["metadata"]["name"]: p
            for p in await self.cluster.list_pods()
            if p["metadata"]["name"] in self.placed
        }
        decided = holds(pods)
        given = answered_holds(self.cluster)
        for what, per_device in (("annotations", decided), ("Allocate answers", given)):
            for uuid, (slots, memory, cores) in per_device.items():
                assert uuid in registered, f"{stage}: {what}: {uuid} is no registered device"
                count, total_memory, total_cores = registered[uuid]
                assert slots <= count and memory <= total_memory and cores <= total_cores, (
                    f"{stage}: {what} over-commit {uuid}: {slots}/{count} slots, "
                    f"{memory}/{total_memory} MiB, {cores}/{total_cores} cores"
                )
        assert decided == given, f"{stage}: decisions {decided} != Allocate answers {given}"


@pytest.fixture(scope="module")
def go_binary() -> Path:
    binary, why = go_scheduler_binary()
    if binary is None:
        pytest.skip(why)
    print(f"\nGo HAMi scheduler: {binary} ({go_version(binary)})", file=sys.__stderr__)
    return binary


@pytest_asyncio.fixture(loop_scope="module")
async def cluster(controlplane: ControlPlane, go_binary: Path) -> AsyncIterator[MigrationCluster]:
    log.configure("warning", "console", stream=sys.__stderr__)
    c = MigrationCluster(go_binary, plane=controlplane)
    async with c:
        yield c


async def test_staged_migration_from_go_hami_with_rollbacks(cluster: MigrationCluster) -> None:
    watch = DropWatch(cluster)
    walk = Walk(cluster, watch)
    task = asyncio.create_task(watch.run(), name="drop-watch")
    try:
        # stage 0: Go HAMi as it runs today; the nodes really are on the stand-in
        for name in GO_PLUGIN:
            annotations = annotations_of(await cluster.kube.get_node(name))
            assert annotations[REGISTER_KEY].startswith("[")
            assert not any(v.startswith("Reported_") for v in annotations.values()), annotations
        assert (await cluster.register_value(C)).startswith("[")
        big = {f"big-{i}": gpu_pod(f"big-{i}", [limits(1, mem=BIG)]) for i in range(6)}
        await walk.place("s0", big)
        devices = {p.decision.split(",")[0] for p in walk.placed.values()}
        assert len(devices) == 6, f"one {BIG} MiB pod per device expected: {walk.placed}"
        await walk.check("s0")

        # stage 1: this project's scheduler in Go's place
        with watch.excuse(list(cluster.nodes)):
            await cluster.use_hami()
        await walk.check("s1")

        # rollback of stage 1: Go's scheduler counts what this one placed
        with watch.excuse(list(cluster.nodes)):
            await cluster.use_go()
        await walk.check("s1-rollback")

        # stage 2 under Go's scheduler: mig-a onto this node agent (json)
        with watch.excuse([A]):
            await cluster.move(A, register.JSON)
        # this project's agent took over: its own heartbeat key, which Go never writes
        annotations = annotations_of(await cluster.kube.get_node(A))
        assert annotations[keys.node_handshake("nvidia")].startswith("Reported_"), annotations
        await walk.check("s2-a-under-go")

        # stage 1 again, then stage 2 for mig-b under this scheduler
        with watch.excuse(list(cluster.nodes)):
            await cluster.use_hami()
        await walk.check("s1-again")
        with watch.excuse([B]):
            await cluster.move(B, register.JSON)
        await walk.check("s2-b-under-hami")

        # rollback of stage 2: mig-b back on Go's plugin, then forward again. This agent's
        # last Reported_ still counts as its heartbeat: once the scheduler's Requesting_
        # stamp on it times out the node is out until that Reported_ is 2 handshake
        # timeouts old (a silent agent and a plugin that never heartbeats look alike);
        # docs/migration.md tells operators to wait that long
        with watch.excuse([B]):
            moved = time.monotonic()
            await cluster.move(B, "go-plugin")
            window = 2 * TIMING.handshake_timeout + 2 * TIMING.handshake_period
            await asyncio.sleep(max(0.0, window - (time.monotonic() - moved)))
            await cluster.wait_available([B], True)
        await walk.check("s2-b-rollback")
        with watch.excuse([B]):
            await cluster.move(B, register.JSON)
        await walk.check("s2-b-again")

        # stage 3: Go's scheduler is gone for good; every agent to the default form
        for name in cluster.nodes:
            with watch.excuse([name]):
                await cluster.move(name, register.SEED)
            assert not (await cluster.register_value(name)).startswith("["), name
        await walk.check("s3")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        lines = [*walk.report, f"not offered while excused (swaps, moves): {watch.gaps()}"]
        print("\n" + "\n".join(lines), file=sys.__stderr__)
    assert watch.samples > 0
