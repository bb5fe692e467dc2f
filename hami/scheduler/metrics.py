"""Prometheus metrics of the scheduler role (one set per instance).

Two kinds of series:

- event counters and histograms (filter, bind, handshake...), kept by prometheus_client
  in a registry of its own;
- cluster gauges read from the cluster state: per device, per node, per pod container
  and per namespace quota, in this project's names (``hami_device_*``) and in Go HAMi's
  (``hami_gpu_*``, ``hami_node_gpu_*``, ``hami_vgpu_*``: same names, labels and units,
  so its Grafana dashboard and HAMi-WebUI read them unchanged).

At 5,000 nodes x 8 devices the gauges are over half a million lines; building them on
every scrape took seconds on the event loop. So each node's and each pod's lines are
rendered once, when the cluster reports that node or pod changed
(``Cluster.changed_nodes``/``changed_pods``), and kept as bytes; a scrape re-renders what
changed in slices that yield to the event loop (a node's lines are one consistent picture
of that node). A worker thread then joins the kept bytes into the body and compresses it
(``write_to``), while the loop leaves them alone (``_Snapshot``): at 65,000 nodes the body
is over a gigabyte, which even joined in slices held the loop for seconds in all. The built body
(plain and gzip, each as asked for) is kept until something changes, so a scrape with no
change since the last one costs the loop only the event counters and the quota lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from hami import buildinfo
from hami.core.cluster import Cluster, NodeState
from hami.core.podrecord import PodRecord

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MIB = 1024 * 1024
# Go HAMi's scheduler registers its cluster collector with this constant label.
ZONE = "vGPU"
SLICE_SECONDS = 0.005  # work between two yields to the event loop during a scrape
SLICE_ITEMS = 256  # nodes or pods joined per piece (``pieces``, the whole text at once)
FLUSH_BYTES = 1 << 20  # the body is written in pieces of at most this much
GZIP_LEVEL = 1  # a fifth of the plain size; higher levels cost far more CPU for little
MAX_CHANGED = 200_000  # changed names kept between two scrapes (then: render everything)


@dataclass(frozen=True, slots=True)
class _Family:
    name: str
    help: str

    def header(self) -> bytes:
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} gauge\n".encode()


# Per node: this project's names (labels model, node, type, uuid), then Go HAMi's.
NODE_FAMILIES = (
    _Family("hami_device_memory_allocated_mib", "Device memory held by pods and reservations, MiB"),
    _Family("hami_device_memory_total_mib", "Schedulable device memory, MiB"),
    _Family("hami_device_cores_allocated_percent", "Device compute held, percent of one device"),
    _Family("hami_device_cores_total_percent", "Schedulable device compute (0: no core limiter)"),
    _Family("hami_device_slots_allocated", "Containers sharing the device"),
    _Family("hami_device_slots_total", "Split count: containers that may share the device"),
    _Family("hami_device_healthy", "1 when the node reports the device healthy"),
    _Family(
        "hami_node_available",
        "1 when the node's device type passes the handshake and its register parses",
    ),
    _Family("hami_gpu_memory_limit_bytes", "Device memory limit for a certain GPU"),
    _Family("hami_gpu_core_limit_ratio", "Device core limit for a certain GPU"),
    _Family("hami_gpu_memory_allocated_bytes", "Device memory allocated for a certain GPU"),
    _Family("hami_gpu_shared_count", "Number of containers sharing this GPU"),
    _Family("hami_gpu_core_allocated_ratio", "Device core allocated for a certain GPU"),
    _Family("hami_node_gpu_overview", "GPU overview on a certain node"),
    _Family(
        "hami_node_gpu_memory_allocated_ratio", "GPU Memory Allocated Percentage on a certain GPU"
    ),
)
# Per pod (Go HAMi's names): one line per container and device.
POD_FAMILIES = (
    _Family("hami_vgpu_memory_allocated_bytes", "vGPU memory allocated from a container"),
    _Family("hami_vgpu_core_allocated_ratio", "vGPU core allocated from a container"),
)
# The groups scheduler.cluster_metrics chooses from, and each family's.
ALL_GROUPS = frozenset({"hami", "go", "pods"})
GROUP_OF = {
    **{family.name: "hami" for family in NODE_FAMILIES[:8]},
    **{family.name: "go" for family in NODE_FAMILIES[8:]},
    **{family.name: "pods" for family in POD_FAMILIES},
}


def _esc(value: str) -> str:
    """A label value as the exposition format writes it (annotations are untrusted)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _num(value: float) -> str:
    return repr(float(value))


def render_node(node: NodeState, own: bool = True, go: bool = True) -> tuple[bytes, ...]:
    """One node's lines of each of ``NODE_FAMILIES``; with ``own`` or ``go`` False, that
    name set's families are left empty instead of rendered (scheduler.cluster_metrics)."""
    lines: list[list[str]]
    (
        own_mem,
        own_mem_total,
        own_cores,
        own_cores_total,
        own_slots,
        own_slots_total,
        own_healthy,
        available,
        go_mem_limit,
        go_core_limit,
        go_mem,
        go_shared,
        go_cores,
        go_overview,
        go_mem_ratio,
    ) = lines = [[] for _ in NODE_FAMILIES]
    node_name = _esc(node.name)
    for word, state in node.types.items():
        type_word = _esc(word)
        if own:
            available.append(
                f'hami_node_available{{node="{node_name}",type="{type_word}"}} '
                f"{1.0 if state.available else 0.0}\n"
            )
        for d in state.devices:
            model, uuid = _esc(d.model), _esc(d.uuid)
            if own:
                mine = f'{{model="{model}",node="{node_name}",type="{type_word}",uuid="{uuid}"}} '
                own_mem.append(f"hami_device_memory_allocated_mib{mine}{_num(d.used_memory)}\n")
                own_mem_total.append(f"hami_device_memory_total_mib{mine}{_num(d.total_memory)}\n")
                own_cores.append(f"hami_device_cores_allocated_percent{mine}{_num(d.used_cores)}\n")
                own_cores_total.append(
                    f"hami_device_cores_total_percent{mine}{_num(d.total_cores)}\n"
                )
                own_slots.append(f"hami_device_slots_allocated{mine}{_num(d.used)}\n")
                own_slots_total.append(f"hami_device_slots_total{mine}{_num(d.count)}\n")
                own_healthy.append(f"hami_device_healthy{mine}{1.0 if d.healthy else 0.0}\n")
            if not go:
                continue
            # Go HAMi's labels: device_type is the register's type (the model word).
            tail = f'device_type="{model}",device_uuid="{uuid}",node="{node_name}",zone="{ZONE}"}} '
            theirs = f'{{device_index="{d.index}",{tail}'
            cores = f'{{device_cores="{d.total_cores}",device_index="{d.index}",'
            used_bytes = _num(d.used_memory * MIB)
            go_mem_limit.append(
                f"hami_gpu_memory_limit_bytes{theirs}{_num(d.total_memory * MIB)}\n"
            )
            go_core_limit.append(f"hami_gpu_core_limit_ratio{theirs}{_num(d.total_cores)}\n")
            go_mem.append(f"hami_gpu_memory_allocated_bytes{cores}{tail}{used_bytes}\n")
            go_shared.append(f"hami_gpu_shared_count{theirs}{_num(d.used)}\n")
            go_cores.append(f"hami_gpu_core_allocated_ratio{theirs}{_num(d.used_cores)}\n")
            go_overview.append(
                f'hami_node_gpu_overview{cores}device_memory_limit="{d.total_memory}",'
                f"{tail}{used_bytes}\n"
            )
            if d.total_memory > 0:
                go_mem_ratio.append(
                    f"hami_node_gpu_memory_allocated_ratio{theirs}"
                    f"{_num(d.used_memory / d.total_memory)}\n"
                )
    return tuple("".join(family).encode() for family in lines)


def render_pod(record: PodRecord) -> tuple[bytes, ...]:
    """One pod's lines of each of ``POD_FAMILIES``: per container (its index in the
    device annotation, as Go HAMi counts) and device, what the decision gives it."""
    namespace, _, name = record.key.partition("/")
    held: dict[tuple[int, str], list[int]] = {}
    for entries in record.assignment.values():
        for index, devices in enumerate(entries):
            for device in devices:
                if device.uuid:
                    total = held.setdefault((index, device.uuid), [0, 0])
                    total[0] += device.memory
                    total[1] += device.cores
    memory: list[str] = []
    cores: list[str] = []
    pod = f'namespace="{_esc(namespace)}",node="{_esc(record.node)}",pod="{_esc(name)}"'
    for (index, uuid), (mib, percent) in held.items():
        labels = f'{{container_index="{index}",device_uuid="{_esc(uuid)}",{pod},zone="{ZONE}"}} '
        memory.append(f"hami_vgpu_memory_allocated_bytes{labels}{_num(mib * MIB)}\n")
        cores.append(f"hami_vgpu_core_allocated_ratio{labels}{_num(percent)}\n")
    return "".join(memory).encode(), "".join(cores).encode()


class _Changed(set[str]):
    """The names the cluster reports changed, up to ``MAX_CHANGED``: past that (no scrape
    for a long time while pods come and go) it stops growing and the next scrape renders
    everything again."""

    overflow = False

    def add(self, name: str) -> None:
        if len(self) < MAX_CHANGED:
            super().add(name)
        else:
            self.overflow = True


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The kept text of one version. The dicts themselves, not copies (a copy of half a
    million entries held the loop for over 10 ms): ``ClusterText`` changes them only
    while it holds its lock, which a build holds until the worker is done, and replaces
    them (never clears them) when it drops its text."""

    version: int
    nodes: dict[str, tuple[bytes, ...]]
    pods: dict[str, tuple[bytes, ...]]
    # the families the kept tuples hold, in their order
    node_families: tuple[_Family, ...] = ()
    pod_families: tuple[_Family, ...] = ()


@dataclass(frozen=True, slots=True)
class _Built:
    """The families' text of one version: plain ``pieces``, or ``packed`` (raw deflate,
    full-flushed so it can be spliced between other deflate data) with the ``crc`` and
    ``size`` of the text it holds."""

    version: int
    # Lists, not tuples: a dropped body is emptied piece by piece (``_release``).
    pieces: list[bytes]
    packed: list[bytes]
    crc: int
    size: int


def _join(snapshot: _Snapshot) -> Iterator[bytes]:
    """The families' text, family by family, in pieces of ``SLICE_ITEMS`` nodes or pods:
    each join is C code that keeps the GIL, so a short one lets the loop's thread in."""
    for families, kept in (
        (snapshot.node_families, snapshot.nodes),
        (snapshot.pod_families, snapshot.pods),
    ):
        for position, family in enumerate(families):
            yield family.header()
            line = itemgetter(position)
            texts = iter(kept.values())
            while piece := b"".join(map(line, islice(texts, SLICE_ITEMS))):
                yield piece


def _coalesce(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """Pieces of about ``FLUSH_BYTES``: a kept plain body is a few hundred objects, and a
    scrape writes each in one go."""
    pending: list[bytes] = []
    size = 0
    for piece in pieces:
        pending.append(piece)
        size += len(piece)
        if size >= FLUSH_BYTES:
            yield b"".join(pending)
            pending.clear()
            size = 0
    if pending:
        yield b"".join(pending)


def _build(snapshot: _Snapshot | None, plain: _Built | None, pack: bool) -> _Built:
    """Run in the worker thread: it reads only the snapshot's (or the plain body's)
    immutable bytes. zlib and large joins let go of the GIL while they work."""
    if plain is not None:
        version, pieces = plain.version, iter(plain.pieces)
    elif snapshot is not None:
        version, pieces = snapshot.version, _join(snapshot)
    else:
        raise ValueError("nothing to build from")
    if not pack:
        return _Built(version, list(_coalesce(pieces)), [], 0, 0)
    packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    crc = size = 0

    def packed() -> Iterator[bytes]:
        nonlocal crc, size
        for piece in pieces:  # streamed: the plain text is never whole in memory
            yield packer.compress(piece)
            crc = zlib.crc32(piece, crc)
            size += len(piece)
        yield packer.flush(zlib.Z_FULL_FLUSH)

    out = list(_coalesce(packed()))
    return _Built(version, [], out, crc, size)


def _release(bodies: list[_Built]) -> None:
    """Run in the worker thread: free dropped bodies a piece (about a megabyte) at a
    time. Freeing a gigabyte body at once on the loop held it for over 100 ms; one
    piece at a time, the loop's thread gets the GIL between pieces."""
    for body in bodies:
        for kept in (body.pieces, body.packed):
            while kept:
                kept.pop()


def _drop(bodies: list[_Built]) -> None:
    if bodies:
        _worker().submit(_release, bodies)


class ClusterText:
    """The cluster gauges as exposition text, kept per node and per pod; only the
    families of ``groups`` (``GROUPS``: scheduler.cluster_metrics) are kept."""

    def __init__(self, cluster: Cluster, groups: Collection[str] = ALL_GROUPS) -> None:
        self.cluster = cluster
        self.node_positions = tuple(
            i for i, family in enumerate(NODE_FAMILIES) if GROUP_OF[family.name] in groups
        )
        self.node_families = tuple(NODE_FAMILIES[i] for i in self.node_positions)
        self.pod_families = POD_FAMILIES if "pods" in groups else ()
        self.groups = frozenset(groups)
        self.nodes: dict[str, tuple[bytes, ...]] = {}
        self.pods: dict[str, tuple[bytes, ...]] = {}
        # Bumped whenever the kept text changes: a built body of the same version is
        # still the cluster's picture.
        self.version = 0
        self._plain: _Built | None = None
        self._packed: _Built | None = None
        self._lock: asyncio.Lock | None = None  # one build at a time (made on the loop)

    def _take(self) -> tuple[list[str], list[str]]:
        """Nodes and pods to re-render: all of them the first time (or after an
        overflow), then what changed."""
        cluster = self.cluster
        nodes, pods = cluster.changed_nodes, cluster.changed_pods
        cluster.changed_nodes, cluster.changed_pods = _Changed(), _Changed()
        if (
            not isinstance(nodes, _Changed)
            or not isinstance(pods, _Changed)
            or nodes.overflow
            or pods.overflow
        ):
            self.nodes, self.pods = {}, {}  # replaced: a build may still read the old
            self.version += 1
            return list(cluster.nodes), list(cluster.pods)
        return list(nodes), list(pods)

    def forget(self) -> None:
        """Stop tracking changes and drop the kept text (a replica that does not lead):
        the next scrape that exports the gauges renders everything again."""
        self.cluster.changed_nodes = self.cluster.changed_pods = None
        self.nodes, self.pods = {}, {}  # replaced: a build may still read the old
        _drop([body for body in (self._plain, self._packed) if body is not None])
        self._plain = self._packed = None
        self.version += 1

    def _update_node(self, name: str) -> None:
        node = self.cluster.nodes.get(name)
        if node is None or not node.types or not self.node_positions:
            self._keep(self.nodes, name, None)
        else:
            lines = render_node(node, "hami" in self.groups, "go" in self.groups)
            self._keep(self.nodes, name, tuple(lines[i] for i in self.node_positions))

    def _update_pod(self, key: str) -> None:
        record = self.cluster.pods.get(key)
        if record is None or not record.values or not self.pod_families:
            self._keep(self.pods, key, None)
        else:
            self._keep(self.pods, key, render_pod(record))

    def _keep(
        self, kept: dict[str, tuple[bytes, ...]], name: str, text: tuple[bytes, ...] | None
    ) -> None:
        # The cluster also reports names whose lines stay the same (a reservation
        # released that was never made): those leave the built body as it is.
        old = kept.pop(name, None) if text is None else kept.get(name)
        if text is not None:
            kept[name] = text
        if text != old:
            self.version += 1

    def catch_up(self) -> None:
        nodes, pods = self._take()
        for name in nodes:
            self._update_node(name)
        for key in pods:
            self._update_pod(key)

    async def catch_up_async(self) -> None:
        """``catch_up``, yielding to the event loop every ``SLICE_SECONDS``."""
        nodes, pods = self._take()
        deadline = time.perf_counter() + SLICE_SECONDS
        for update, items in ((self._update_node, nodes), (self._update_pod, pods)):
            for item in items:
                update(item)
                if time.perf_counter() > deadline:
                    await asyncio.sleep(0)
                    deadline = time.perf_counter() + SLICE_SECONDS

    def snapshot(self) -> _Snapshot:
        """The kept text as it is now, for the worker thread (see ``_Snapshot``)."""
        return _Snapshot(self.version, self.nodes, self.pods, self.node_families, self.pod_families)

    def built(self) -> _Built:
        """The families' text at the current version (built here if not kept)."""
        if self._lock is not None and self._lock.locked():
            # The worker is reading the kept text: changing it now would mix versions.
            raise RuntimeError("a scrape is being built; use write_to meanwhile")
        self.catch_up()
        if self._plain is None or self._plain.version != self.version:
            _drop([self._plain] if self._plain is not None else [])
            self._plain = _build(self.snapshot(), None, False)
        return self._plain

    async def built_async(self, *, gzip: bool) -> _Built:
        """The families' text at the current version, plain or as one raw deflate
        stream: the kept one when nothing changed since it was built, else built in the
        worker thread from a snapshot (the loop only re-renders what changed)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # a second scrape meanwhile waits for this one's body
            await self.catch_up_async()
            version = self.version
            kept = self._packed if gzip else self._plain
            if kept is not None and kept.version == version:
                return kept
            plain = (
                self._plain if self._plain is not None and self._plain.version == version else None
            )
            snapshot = None if plain is not None else self.snapshot()
            loop = asyncio.get_running_loop()
            built = await loop.run_in_executor(_worker(), _build, snapshot, plain, gzip)
            # Only the kind asked for is kept: Prometheus asks for gzip, and a kept
            # plain body would double the memory of the kept text.
            stale = [body for body in (self._plain, self._packed) if body is not None]
            if gzip:
                self._packed = built
            else:
                self._plain = built
            if self._plain is not None and self._plain.version != version:
                self._plain = None
            if self._packed is not None and self._packed.version != version:
                self._packed = None
            _drop([body for body in stale if body is not self._plain and body is not self._packed])
            return built

    def small(self) -> bytes:
        """Gauges with a few lines each: built per scrape."""
        cluster = self.cluster
        out = [
            "# HELP hami_pods_holding_devices Pods (and reservations) counted\n",
            "# TYPE hami_pods_holding_devices gauge\n",
            f"hami_pods_holding_devices {_num(len(cluster.pods))}\n",
        ]
        # Go HAMi's names and labels: quota_name is the resource (nvidia.com/gpumem),
        # limit the limit as written ("0" when none is set); used is in MiB or percent.
        used = [
            "# HELP hami_resource_quota_used Device memory (MiB) or cores (percent) held by"
            " a namespace's pods\n# TYPE hami_resource_quota_used gauge\n"
        ]
        limit = [
            "# HELP hami_resource_quota_limit ResourceQuota limits.<resource> of a namespace,"
            " as written in the quota\n# TYPE hami_resource_quota_limit gauge\n"
        ]
        for row in cluster.quotas.rows():
            labels = f'namespace="{_esc(row.namespace)}",quota_name="{_esc(row.resource.name)}"'
            used.append(
                f'hami_resource_quota_used{{limit="{row.limit or 0}",{labels}}} {_num(row.used)}\n'
            )
            if row.limit is not None:
                limit.append(f"hami_resource_quota_limit{{{labels}}} {_num(row.limit)}\n")
        return "".join(out + used + limit).encode()


class SchedulerMetrics:
    def __init__(self, cluster: Cluster, groups: Collection[str] = ALL_GROUPS) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.cluster_text = ClusterText(cluster, groups)
        # False: leave the cluster gauges out (a replica that does not lead).
        self.cluster_gauges = True
        # Go HAMi's scheduler registers it beside its cluster collector (no zone label).
        buildinfo.register(self.registry)
        self.filter_seconds = Histogram(
            "hami_filter_duration_seconds",
            "Time to answer an extender filter call, by outcome",
            ["outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "hami_filter_decision_seconds",
            "Time of the decision alone (no JSON, no API calls)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bind_seconds = Histogram(
            "hami_bind_duration_seconds",
            "Time to answer an extender bind call (lock wait included), by outcome",
            ["outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.filter_total = Counter(
            "hami_filter",
            "Filter calls by outcome: scheduled, unschedulable, passthrough, error",
            ["outcome"],
            registry=self.registry,
        )
        self.node_rejections = Counter(
            "hami_filter_node_rejections",
            "Nodes rejected by failing filter calls, by reason code",
            ["reason"],
            registry=self.registry,
        )
        self.bind_total = Counter(
            "hami_bind",
            "Bind calls by outcome (success, failed) and reason",
            ["outcome", "reason"],
            registry=self.registry,
        )
        self.availability_changes = Counter(
            "hami_node_availability_changes",
            "Times a node's device type became available or unavailable",
            ["type", "available"],
            registry=self.registry,
        )
        self.handshake_patches = Counter(
            "hami_handshake_patches",
            "Handshake patches by result: ok, conflict, error",
            ["result"],
            registry=self.registry,
        )
        self.annotation_errors = Counter(
            "hami_annotation_errors",
            "Malformed annotations found on nodes or pods",
            ["object"],
            registry=self.registry,
        )

        # Every known series exists at 0 from the start, so rate() and "increase > 0"
        # alerts work before the first event of each kind.
        for outcome in ("scheduled", "unschedulable", "passthrough", "error"):
            self.filter_total.labels(outcome)
            self.filter_seconds.labels(outcome)
        self.bind_total.labels("success", "bound")
        for reason in ("node_locked", "binding", "wrong_node", "refused", "standby", "error"):
            self.bind_total.labels("failed", reason)
        for outcome in ("success", "failed"):
            self.bind_seconds.labels(outcome)
        for result in ("ok", "conflict", "error"):
            self.handshake_patches.labels(result)
        for obj in ("node", "pod"):
            self.annotation_errors.labels(obj)

    def render(self) -> bytes:
        """The whole exposition at once (tests, tools); the HTTP handler uses ``write_to``."""
        head = generate_latest(self.registry)
        if not self.cluster_gauges:
            self.cluster_text.forget()
            return head
        built = self.cluster_text.built()
        return b"".join((head, *built.pieces, self.cluster_text.small()))

    async def write_to(
        self, write: Callable[[bytes], Awaitable[None]], *, gzip: bool = False
    ) -> int:
        """Write the exposition in pieces of ``FLUSH_BYTES``, yielding to the event loop
        between pieces so that filter and bind calls are never held up by a scrape; bytes
        sent. The cluster families come from ``ClusterText.built_async`` (joined and
        compressed off the loop, kept while nothing changes); the event counters and the
        quota lines, a few kilobytes, are built per scrape around them.

        With ``gzip`` the body is one gzip stream: the kept deflate data between the
        counters' and the quota lines' own, its CRC combined from the three parts'."""
        head = generate_latest(self.registry)
        built: _Built | None = None
        tail = b""
        if self.cluster_gauges:
            built = await self.cluster_text.built_async(gzip=gzip)
            tail = self.cluster_text.small()
        else:
            self.cluster_text.forget()
        if gzip:
            parts = _gzip_parts(head, built, tail)
        else:
            parts = [head, *(built.pieces if built is not None else ()), tail]
        sent = 0
        for part in parts:
            view = memoryview(part)  # slices of it are not copies
            for start in range(0, len(view), FLUSH_BYTES):
                piece = view[start : start + FLUSH_BYTES]
                await write(piece)  # type: ignore[arg-type]  # aiohttp takes any buffer
                sent += len(piece)
                await asyncio.sleep(0)
        return sent


# A gzip member's header (RFC 1952): no name, no time, "fastest" compression, Unix.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\x03"


def _gzip_parts(head: bytes, built: _Built | None, tail: bytes) -> list[bytes]:
    """One gzip stream of ``head``, the kept text and ``tail``: a full flush ends each
    deflate part on a byte with no reference to what came before, so the parts join."""
    first = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    last = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    crc, size = zlib.crc32(head), len(head)
    middle: list[bytes] = []
    if built is not None:
        crc, size = crc32_combine(crc, built.crc, built.size), size + built.size
        middle = built.packed
    crc, size = crc32_combine(crc, zlib.crc32(tail), len(tail)), size + len(tail)
    return [
        GZIP_HEADER + first.compress(head) + first.flush(zlib.Z_FULL_FLUSH),
        *middle,
        last.compress(tail) + last.flush() + struct.pack("<II", crc, size & 0xFFFFFFFF),
    ]


# CRC-32 of two texts joined, from each one's CRC and the second's length: zlib's
# crc32_combine (1.2.12's method), which Python's zlib module does not export.
_CRC_POLY = 0xEDB88320  # reflected


def _multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC polynomial (bit 31 is x^0)."""
    m = 1 << 31
    product = 0
    while True:
        if a & m:
            product ^= b
            if a & (m - 1) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1
    return product


def _powers() -> tuple[int, ...]:
    power = [1 << 30]  # x^1
    for _ in range(31):
        power.append(_multmodp(power[-1], power[-1]))
    return tuple(power)


_X2N = _powers()  # x^(2^n) modulo the polynomial


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """The CRC-32 of A + B from ``crc32(A)``, ``crc32(B)`` and ``len(B)``."""
    power, k, n = 1 << 31, 3, length2  # x^(8 * length2): the first CRC moved past B
    while n:
        if n & 1:
            power = _multmodp(_X2N[k & 31], power)
        n >>= 1
        k += 1
    return _multmodp(power, crc1) ^ crc2


_WORKER: list[ThreadPoolExecutor] = []  # one per process, made on the first scrape


def _worker() -> ThreadPoolExecutor:
    if not _WORKER:
        _WORKER.append(ThreadPoolExecutor(1, "hami-metrics", initializer=_lower_priority))
    return _WORKER[0]


def _lower_priority() -> None:
    """Linux nices threads one by one: where cores are short, the event loop's thread
    goes first and the body's building waits."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
