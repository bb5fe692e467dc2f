"""``scripts/gpu-check.sh``: prove the NVIDIA backend on a machine with a real GPU (issue 13).

One run, no arguments needed, five steps, one report line per check:

1. ``nvidia-smi --query-gpu=uuid,name,memory.total --format=csv`` against
   ``hami devices --backend nvidia``: every GPU with the same uuid, index, model, memory
   (after ``memory_scaling``), NUMA node (``nvidia-smi topo -m``) and health;
2. the local control plane, the hami scheduler role, kube-scheduler, a kubelet emulator and a
   node agent with the NVIDIA backend: a pod asking for a slice (memory and cores) and its
   ``Allocate`` answer (``NVIDIA_VISIBLE_DEVICES`` the real uuid, the limits, the mounts);
3. HAMi-core, where it can be built here (``hami.testkit.gpucheck_cuda``): a CUDA program
   under the answer's environment with ``libvgpu.so`` preloaded; skipped, saying why, where not;
4. NVML health events registered on every GPU; the topology pair scores the backend writes
   (``hami.io/node-nvidia-score``) against ``nvidia-smi topo -m``;
5. MIG, reading only (``hami.testkit.gpucheck_mig``): on a GPU in MIG mode, the profiles and
   placements the backend reads against ``nvidia-smi mig -lgip`` / ``-lgipp``; a SKIP line
   where MIG is off or absent (the check never changes a MIG mode);
6. the report; exit status 1 on any FAIL.

Without a GPU (no ``nvidia-smi``, or it fails, or it lists none) it prints one line and
exits 0, so CI runs it as it is; a GPU nvidia-smi lists but NVML cannot open is one line and
exit 1; a configuration that does not load, exit 2. Tests replace the driver (``nvml=``, a
fake pynvml) and the ``hami devices`` call (``hami_devices=``); everything else is the code a
GPU machine runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hami import config, log
from hami.backends import _nvml
from hami.backends.base import BackendError, BackendSettings, Device
from hami.backends.hamicore import HamiCorePaths
from hami.backends.nvidia import NvidiaBackend
from hami.backends.nvidia_names import NVIDIA_RESOURCES
from hami.core.topology import parse_pair_scores, score_key
from hami.node.agent import NodeAgent
from hami.protocol import NodeDevice, ProtocolError, decode_node_devices, keys
from hami.testkit import gpucheck_cuda, gpucheck_mig
from hami.testkit.cluster import CLUSTER_LABEL, LocalCluster, gpu_pod, limits, poll
from hami.testkit.controlplane import ControlPlane, ControlPlaneError, find_binaries
from hami.testkit.gpucheck_run import Answer, Check, Ran, Report, Runner, run_command
from hami.testkit.kubelet import KubeletEmulator, PodAdmission

SMI_QUERY = ("nvidia-smi", "--query-gpu=uuid,name,memory.total", "--format=csv")
SMI_TOPO = ("nvidia-smi", "topo", "-m")
SMI_DRIVER = ("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
#: The slice step 2 asks for: MiB of device memory and percent of its cores.
SLICE_MEMORY_MIB = 2048  # room for the CUDA context, which HAMi-core may count
SLICE_CORES = 30


# --------------------------------------------------------------------------- nvidia-smi


@dataclass(frozen=True)
class SmiGpu:
    """One row of ``nvidia-smi --query-gpu=uuid,name,memory.total --format=csv``."""

    index: int  # row order: nvidia-smi lists GPUs in NVML index order
    uuid: str
    name: str
    memory_mib: int | None  # None: nvidia-smi could not read it
    problems: tuple[str, ...] = ()  # fields nvidia-smi answered with an error

    @property
    def healthy(self) -> bool:
        return not self.problems


_SMI_ERROR = re.compile(r"^\[.*\]$")  # [N/A], [Unknown Error], [GPU requires reset] ...


def parse_smi_query(text: str) -> list[SmiGpu]:
    """The GPUs of the CSV answer (header line first); raises ValueError on another shape."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [cell.strip().lower() for cell in lines[0].split(",")]
    if len(header) < 3 or not header[0].startswith("uuid") or not header[1].startswith("name"):
        raise ValueError(f"unexpected nvidia-smi header {lines[0]!r}")
    gpus: list[SmiGpu] = []
    for index, line in enumerate(lines[1:]):
        # The name never holds a comma in practice; split from the right to be safe.
        uuid, _, rest = line.partition(",")
        name, _, memory = rest.rpartition(",")
        cells = {"uuid": uuid.strip(), "name": name.strip(), "memory.total": memory.strip()}
        if not cells["uuid"] or not cells["name"]:
            raise ValueError(f"unexpected nvidia-smi row {line!r}")
        problems = tuple(f"{k}={v}" for k, v in cells.items() if _SMI_ERROR.match(v))
        gpus.append(
            SmiGpu(index, cells["uuid"], cells["name"], _mib(cells["memory.total"]), problems)
        )
    return gpus


def _mib(text: str) -> int | None:
    match = re.fullmatch(r"(\d+)\s*MiB", text.strip())
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Topology:
    """``nvidia-smi topo -m``: each GPU's NUMA affinity and the link of each GPU pair."""

    numa: dict[int, str]  # GPU index -> the NUMA Affinity cell ("0", "N/A", "0-1")
    links: dict[tuple[int, int], str]  # (i, j), i < j -> "NV18", "SYS", "PIX", ...


def parse_topo(text: str) -> Topology:
    """Read the matrix; raises ValueError when there is none."""
    rows = [line for line in text.splitlines() if line.strip()]
    header_at = next((i for i, r in enumerate(rows) if re.match(r"^\s+GPU0\b", r)), None)
    if header_at is None:
        raise ValueError("no GPU matrix in nvidia-smi topo -m output")
    header = [c.strip() for c in rows[header_at].split("\t") if c.strip()]
    numa: dict[int, str] = {}
    links: dict[tuple[int, int], str] = {}
    for row in rows[header_at + 1 :]:
        cells = [c.strip() for c in row.split("\t") if c.strip()]
        match = re.fullmatch(r"GPU(\d+)", cells[0]) if cells else None
        if match is None:
            if cells and cells[0].startswith("Legend"):
                break
            continue
        me = int(match.group(1))
        if len(cells) != len(header) + 1:
            continue  # an empty cell shifted the row: better unread than misread
        for column, cell in zip(header, cells[1:], strict=True):
            other = re.fullmatch(r"GPU(\d+)", column)
            if other and int(other.group(1)) > me:
                links[(me, int(other.group(1)))] = cell
            elif column == "NUMA Affinity":
                numa[me] = cell
    return Topology(numa, links)


def expected_numa(cell: str | None) -> int | None:
    """The node hami should report for a NUMA Affinity cell; None when it names none."""
    if cell is None:
        return None
    if cell.upper() == "N/A":
        return 0  # no NUMA node (sysfs says -1): hami reports 0, as HAMi does
    return int(cell) if cell.isdigit() else None


# --------------------------------------------------------------------------- hami devices


def parse_hami_devices(text: str, type_word: str = "nvidia") -> list[NodeDevice]:
    """The devices ``hami devices`` printed: its register annotation, with the table's index.

    Raises ValueError when the output has neither a device count nor the annotation."""
    count = re.search(rf"^backend \S+ \(type {re.escape(type_word)}\): (\d+) device", text, re.M)
    if count is None:
        raise ValueError("no 'backend ... device(s)' line in the output")
    if int(count.group(1)) == 0:
        return []
    key = keys.node_register(type_word)
    found = re.search(rf"^\s+{re.escape(key)}: (.+)$", text, re.M)
    if found is None:
        raise ValueError(f"no {key} line in the output")
    try:
        devices = decode_node_devices(found.group(1).strip())
    except ProtocolError as exc:
        raise ValueError(f"{key} does not decode: {exc}") from exc
    indices: dict[str, int] = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 2 and cells[0].isdigit():
            indices[cells[1]] = int(cells[0])
    return [replace(d, index=indices.get(d.uuid, d.index)) for d in devices]


def compare_devices(
    smi: Sequence[SmiGpu],
    hami: Sequence[NodeDevice],
    settings: BackendSettings,
    topo: Topology | None,
) -> list[Check]:
    """One check per GPU nvidia-smi lists, one per device only hami lists."""
    checks: list[Check] = []
    by_uuid = {d.uuid: d for d in hami}
    for gpu in smi:
        name = f"step1 GPU{gpu.index} {gpu.uuid}"
        device = by_uuid.pop(gpu.uuid, None)
        if device is None:
            checks.append(Check(name, "FAIL", "nvidia-smi lists it, hami devices does not"))
            continue
        wrong = _differences(gpu, device, settings, topo)
        read = topo is not None and expected_numa(topo.numa.get(gpu.index)) is not None
        numa_note = "" if read else ", NUMA not checked"
        if wrong:
            checks.append(Check(name, "FAIL", "; ".join(wrong)))
        else:
            checks.append(
                Check(
                    name,
                    "PASS",
                    f"{device.model}, {device.memory} MiB, NUMA {device.numa}, "
                    f"healthy={str(device.healthy).lower()}, split {device.count}, "
                    f"cores {device.cores}{numa_note}",
                )
            )
    for device in by_uuid.values():
        checks.append(
            Check(
                f"step1 {device.uuid}",
                "FAIL",
                f"hami devices lists it (index {device.index}), nvidia-smi does not",
            )
        )
    return checks


def _differences(
    gpu: SmiGpu, device: NodeDevice, settings: BackendSettings, topo: Topology | None
) -> list[str]:
    want: dict[str, object] = {
        "index": gpu.index,
        "model": _nvml.model_name(gpu.name),
        "healthy": gpu.healthy,
        "split": settings.split_count,
        "cores": int(100 * settings.core_scaling),
    }
    have: dict[str, object] = {
        "index": device.index,
        "model": device.model,
        "healthy": device.healthy,
        "split": device.count,
        "cores": device.cores,
    }
    if gpu.memory_mib is not None:
        want["memory MiB"] = int(gpu.memory_mib * settings.memory_scaling)
        have["memory MiB"] = device.memory
    numa = expected_numa(topo.numa.get(gpu.index)) if topo is not None else None
    if numa is not None:
        want["NUMA"] = numa
        have["NUMA"] = device.numa
    wrong = [f"{k}: nvidia-smi {want[k]!r}, hami {have[k]!r}" for k in want if want[k] != have[k]]
    if gpu.problems and wrong:
        wrong.append(f"nvidia-smi could not read {', '.join(gpu.problems)}")
    return wrong


# --------------------------------------------------------------------------- step 1


HamiDevices = Callable[[Sequence[str]], Ran]
"""Runs ``hami devices`` with these extra arguments (tests run it in-process)."""


def hami_devices_subprocess(extra: Sequence[str]) -> Ran:
    argv = [sys.executable, "-m", "hami", "devices", "--backend", "nvidia", *extra]
    return run_command(argv, timeout=120.0)


def step1(
    smi: Sequence[SmiGpu],
    topo: Topology | None,
    settings: BackendSettings,
    hami_devices: HamiDevices,
    config_path: str | None,
) -> list[Check]:
    extra = ["--log-level", "error"] + (["--config", config_path] if config_path else [])
    ran = hami_devices(extra)
    if not ran.ok:
        return [Check("step1 hami devices", "FAIL", ran.why())]
    try:
        hami = parse_hami_devices(ran.stdout)
    except ValueError as exc:
        return [Check("step1 hami devices", "FAIL", f"cannot read its output: {exc}")]
    return compare_devices(smi, hami, settings, topo)


# --------------------------------------------------------------------------- step 2


class GpuNode:
    """A kubelet emulator and a node agent with the given NVIDIA backend, on a LocalCluster
    (what ``SimNode`` is for the fake backend)."""

    def __init__(self, cluster: LocalCluster, backend: NvidiaBackend, workdir: Path) -> None:
        self.cluster = cluster
        self.name = f"gpu-check-{cluster.id}"
        self.backend = backend
        self.workdir = workdir
        self.kubelet: KubeletEmulator | None = None
        self.agent: NodeAgent | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, devices: int) -> None:
        self.kubelet = KubeletEmulator(
            self.name,
            self.cluster.kubeconfig,
            self.workdir / "plugins",
            labels={CLUSTER_LABEL: self.cluster.id},
        )
        await self.kubelet.start()
        timing = self.cluster.timing
        self.agent = NodeAgent(
            self.cluster.cfg,
            node_name=self.name,
            kubeconfig=str(self.cluster.kubeconfig),  # its own client, as on a real node
            backends={"nvidia": self.backend},
            register_period=timing.register_period,
            device_plugin_dir=str(self.kubelet.plugin_dir),
            serve_http=False,
            kubelet_poll=timing.kubelet_poll,
            min_backoff=min(1.0, timing.register_period),
        )
        self._task = asyncio.create_task(self.agent.run(), name="node-agent[gpu-check]")
        await self.agent.wait_ready()
        await self.kubelet.wait_for_resource(
            NVIDIA_RESOURCES.count, healthy=devices * self.backend.settings.split_count
        )

    async def stop(self) -> None:
        if self.agent is not None:
            await self.agent.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.kubelet is not None:
            await self.kubelet.stop()
            with contextlib.suppress(Exception):  # a shared control plane keeps no stray node
                await _delete_node(self.cluster.kubeconfig, self.name)


async def _delete_node(kubeconfig: Path, name: str) -> None:
    from kubernetes_asyncio import client
    from kubernetes_asyncio import config as kube_config

    configuration = client.Configuration()
    await kube_config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration
    )
    async with client.ApiClient(configuration) as api:
        await client.CoreV1Api(api).delete_node(name)


def step2_checks(
    admission: PodAdmission, smi_uuids: Sequence[str], paths: HamiCorePaths
) -> list[Check]:
    """The Allocate answer of the slice pod against what a HAMi-core container needs."""
    if admission.phase != "Running":
        return [
            Check(
                "step2 allocate",
                "FAIL",
                f"pod {admission.namespace}/{admission.name} is {admission.phase}: "
                f"{admission.reason}: {admission.message}",
            )
        ]
    envs = admission.envs.get("c0", {})
    mounts = _mounts(admission)
    checks: list[Check] = []
    visible = envs.get("NVIDIA_VISIBLE_DEVICES", "")
    checks.append(
        Check(
            "step2 NVIDIA_VISIBLE_DEVICES",
            "PASS" if visible in smi_uuids else "FAIL",
            f"{visible or '(unset)'}"
            + ("" if visible in smi_uuids else f"; nvidia-smi lists {', '.join(smi_uuids)}"),
        )
    )
    want = {
        "CUDA_DEVICE_MEMORY_LIMIT_0": f"{SLICE_MEMORY_MIB}m",
        "CUDA_DEVICE_SM_LIMIT": str(SLICE_CORES),
    }
    wrong = [f"{k}={envs.get(k)!r}, want {v!r}" for k, v in want.items() if envs.get(k) != v]
    checks.append(
        Check(
            "step2 limits",
            "FAIL" if wrong else "PASS",
            "; ".join(wrong) or ", ".join(f"{k}={v}" for k, v in want.items()),
        )
    )
    checks.append(_mount_check(mounts, envs, admission, paths))
    return checks


def _mounts(admission: PodAdmission) -> dict[str, tuple[str, bool]]:
    out: dict[str, tuple[str, bool]] = {}
    for allocation in admission.for_container("c0"):
        for mount in allocation.response.mounts:
            out[mount.container_path] = (mount.host_path, bool(mount.read_only))
    return out


def _mount_check(
    mounts: Mapping[str, tuple[str, bool]],
    envs: Mapping[str, str],
    admission: PodAdmission,
    paths: HamiCorePaths,
) -> Check:
    host_dir = os.path.join(paths.containers_dir, f"{admission.uid}_c0")
    want = {
        paths.library: (paths.library, True),
        paths.vgpu_dir: (host_dir, False),
        paths.lock_dir: (paths.lock_dir, False),
        "/etc/ld.so.preload": (paths.preload, True),
    }
    wrong = [
        f"{path}: {mounts.get(path)!r}, want {source!r}"
        for path, source in want.items()
        if mounts.get(path) != source
    ]
    cache = envs.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "")
    if not cache.startswith(paths.vgpu_dir + "/"):
        wrong.append(f"CUDA_DEVICE_MEMORY_SHARED_CACHE={cache!r} is not under {paths.vgpu_dir}")
    if not Path(host_dir).is_dir():
        wrong.append(f"host directory {host_dir} was not created")
    return Check(
        "step2 mounts",
        "FAIL" if wrong else "PASS",
        "; ".join(wrong) or ", ".join(sorted(want)) + f" (host dir {Path(host_dir).name})",
    )


def answer_of(
    admission: PodAdmission, smi_uuids: Sequence[str], paths: HamiCorePaths
) -> Answer | None:
    envs = admission.envs.get("c0", {})
    uuid = envs.get("NVIDIA_VISIBLE_DEVICES", "")
    if admission.phase != "Running" or uuid not in smi_uuids:
        return None
    return Answer(
        uuid,
        smi_uuids.index(uuid),
        SLICE_MEMORY_MIB,
        SLICE_CORES,
        dict(envs),
        _mounts(admission),
        paths.lock_dir,
    )


AfterAllocate = Callable[[Answer], Awaitable[list[Check]]]


async def step2(
    settings: BackendSettings,
    smi_uuids: Sequence[str],
    nvml: Any,
    after: AfterAllocate,
    plane: ControlPlane | None = None,
) -> list[Check]:
    """Place the slice pod on a node agent with the NVIDIA backend; ``after`` runs (step 3)
    while the answer's host directories still exist. ``plane``: a running control plane
    (tests), else one is started here."""
    if plane is None:
        try:
            find_binaries()
        except ControlPlaneError as exc:
            return [Check("step2 control plane", "FAIL", str(exc))]
    cluster = LocalCluster(nodes=(), plane=plane)
    workdir = cluster.workdir / "gpu"
    options = dict(settings.options)
    options["hamicore"] = {**dict(options.get("hamicore") or {}), **_hamicore_dirs(workdir)}
    backend = NvidiaBackend(replace(settings, options=options), nvml=nvml)
    node = GpuNode(cluster, backend, workdir)
    checks: list[Check] = []
    try:
        async with cluster:
            try:
                await node.start(len(smi_uuids))
                pod = gpu_pod("gpu-check", [limits(1, mem=SLICE_MEMORY_MIB, cores=SLICE_CORES)])
                await cluster.create_pod(pod)
                await cluster.wait_pod("gpu-check", timeout=60.0)
                assert node.kubelet is not None
                admission = await node.kubelet.wait_for_admission(
                    cluster.namespace, "gpu-check", 30.0
                )
                checks.extend(step2_checks(admission, smi_uuids, backend.paths))
                answer = answer_of(admission, smi_uuids, backend.paths)
                if answer is not None:
                    checks.extend(await after(answer))
                else:
                    checks.append(Check("step3 hami-core", "SKIP", "no Allocate answer (step 2)"))
            finally:
                await node.stop()
    except Exception as exc:  # a check reports what broke and goes on to the next step
        checks.append(Check("step2 allocate", "FAIL", f"{type(exc).__name__}: {exc}"))
    finally:
        await backend.close()
    return checks


def _hamicore_dirs(workdir: Path) -> dict[str, str]:
    """Per-container directories under the check's work dir, not the host's /usr/local/vgpu."""
    return {"containers_dir": str(workdir / "vgpu")}


# --------------------------------------------------------------------------- step 4


class RecordingNvml:
    """pynvml (or a fake) with the health registration recorded: the event types each device
    supports, what the backend registered and the driver took, what the driver refused as
    not supported."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self.registered: list[tuple[str, int]] = []  # (uuid, event type mask)
        self.supported: dict[str, int] = {}  # uuid -> supported event type mask
        self.not_supported: set[str] = set()  # registration refused as not supported

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)

    def _uuid(self, handle: Any) -> str:
        return _nvml.text(self._nvml.nvmlDeviceGetUUID(handle))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        mask = int(self._nvml.nvmlDeviceGetSupportedEventTypes(handle))
        with self._lock:
            self.supported[self._uuid(handle)] = mask
        return mask

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: Any) -> None:
        try:
            self._nvml.nvmlDeviceRegisterEvents(handle, types, event_set)
        except self._nvml.NVMLError_NotSupported:
            with self._lock:
                self.not_supported.add(self._uuid(handle))
            raise
        with self._lock:
            self.registered.append((self._uuid(handle), int(types)))

    def settled(self, uuids: Sequence[str], xid: int) -> bool:
        """Whether every device is registered or known to offer no Xid events."""
        with self._lock:
            done = {u for u, _ in self.registered} | self.not_supported
            done |= {u for u, mask in self.supported.items() if not mask & xid}
        return done >= set(uuids)


async def step4_health(
    settings: BackendSettings,
    nvml: Any,
    seconds: float = 5.0,
) -> Check:
    """Run ``watch_health`` until every device's events are registered (or ``seconds``)."""
    if nvml is None:
        import pynvml

        nvml = pynvml
    recorder = RecordingNvml(nvml)
    options = {**dict(settings.options), "event_timeout_ms": 200}
    backend = NvidiaBackend(replace(settings, options=options), nvml=recorder)
    unhealthy: list[str] = []
    try:
        devices = await backend.enumerate()
        task = asyncio.create_task(
            backend.watch_health(devices, lambda uuid, ok: None if ok else unhealthy.append(uuid))
        )
        xid = int(nvml.nvmlEventTypeXidCriticalError)
        uuids = [d.uuid for d in devices]
        with contextlib.suppress(TimeoutError):  # what is not settled by then is reported
            await poll(
                lambda: recorder.settled(uuids, xid) or task.done(),
                seconds,
                "NVML health registration",
                interval=0.05,
            )
        await asyncio.sleep(0)  # a failed registration reports through the loop: let it
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # its own error is a FAIL below
            await task
    except Exception as exc:  # BackendError, or NVML failing in a way nobody foresaw
        return Check("step4 health events", "FAIL", f"{type(exc).__name__}: {exc}")
    finally:
        await backend.close()
    return _health_check(devices, recorder, unhealthy, xid)


def _health_check(
    devices: Sequence[Device], recorder: RecordingNvml, unhealthy: Sequence[str], xid: int
) -> Check:
    name = "step4 health events"
    with_xid = {uuid for uuid, mask in recorder.registered if mask & xid}
    missing = [d.uuid for d in devices if d.uuid not in with_xid]
    if unhealthy:
        marked = ", ".join(sorted(set(unhealthy)))
        return Check(name, "FAIL", f"the backend marked {marked} unhealthy while registering")
    # The driver says it has no Xid events for these (a virtual GPU, an old board): the
    # backend warns (nvidia.health_not_supported) and keeps them in use; nothing to show.
    unsupported = [
        u for u in missing if u in recorder.not_supported or not recorder.supported.get(u, 0) & xid
    ]
    if missing and len(unsupported) == len(missing):
        return Check(
            name,
            "SKIP",
            f"the driver offers no Xid critical error events on {', '.join(missing)} "
            f"(supported event types {_masks(recorder.supported, missing)})",
        )
    if missing:
        return Check(
            name, "FAIL", f"Xid critical error events not registered on {', '.join(missing)}"
        )
    masks = ", ".join(hex(m) for m in sorted({mask for _, mask in recorder.registered}))
    return Check(
        name,
        "PASS",
        f"event set registered on {len(devices)} GPU(s), event types {masks} "
        f"(Xid critical error = {hex(xid)})",
    )


def _masks(supported: Mapping[str, int], uuids: Sequence[str]) -> str:
    return ", ".join(f"{hex(supported[u])}" if u in supported else "unknown" for u in uuids)


# nvidia-smi topo -m's PCIe words -> the score Go HAMi (and hami) give that path; an NVLink
# cell (NV#) hides the PCIe path, so it scores 100 per link plus one of these or nothing.
TOPO_PCIE_SCORES = {"PIX": 50, "PXB": 40, "PHB": 30, "NODE": 20, "SYS": 10, "SOC": 10}
NVLINK_CELL = re.compile(r"NV(\d+)")


def expected_scores(cell: str) -> tuple[int, ...] | None:
    """The link scores a ``topo -m`` cell allows; None when the cell names no known link."""
    if cell in TOPO_PCIE_SCORES:
        return (TOPO_PCIE_SCORES[cell],)
    match = NVLINK_CELL.fullmatch(cell)
    if match is None:
        return None
    links = 100 * int(match.group(1))
    return (links, *(links + pcie for pcie in sorted(set(TOPO_PCIE_SCORES.values()) | {60})))


def compare_scores(
    smi: Sequence[SmiGpu], topo: Topology, value: str | None, option_on: bool
) -> Check:
    """hami's ``hami.io/node-nvidia-score`` value against ``nvidia-smi topo -m``."""
    name = "step4 topology scores"
    if not topo.links:
        return Check(name, "SKIP", "one GPU: no pairs to score")
    if not option_on:
        return Check(name, "SKIP", "topology_score is off in the configuration")
    if not value:
        return Check(name, "FAIL", f"the backend wrote no {score_key('nvidia')} value")
    try:
        scores = parse_pair_scores(value)
    except ValueError as exc:
        return Check(name, "FAIL", f"{score_key('nvidia')} does not read: {exc}")
    uuid_of = {g.index: g.uuid for g in smi}
    wrong: list[str] = []
    unknown: list[str] = []
    for (i, j), cell in sorted(topo.links.items()):
        allowed = expected_scores(cell)
        if allowed is None:
            unknown.append(f"GPU{i}-GPU{j} {cell}")
            continue
        a, b = uuid_of.get(i), uuid_of.get(j)
        got = {scores.get(x, {}).get(y) for x, y in ((a, b), (b, a)) if x and y}
        if len(got) != 1 or next(iter(got)) not in allowed:
            wrong.append(f"GPU{i}-GPU{j} {cell}: hami {sorted(got, key=str)}, expected {allowed}")
    if wrong:
        return Check(name, "FAIL", "; ".join(wrong))
    detail = f"{len(topo.links) - len(unknown)} pair(s) match nvidia-smi topo -m"
    if unknown:
        detail += f"; not checked (unknown link words): {', '.join(unknown)}"
    return Check(name, "PASS", detail)


async def step4_topology(
    settings: BackendSettings,
    nvml: Any,
    smi: Sequence[SmiGpu],
    topo: Topology | None,
    topo_why: str,
) -> Check:
    """The pair scores the NVIDIA backend would write, against ``nvidia-smi topo -m``."""
    if topo is None:
        return Check("step4 topology scores", "SKIP", f"nvidia-smi topo -m unreadable ({topo_why})")
    backend = NvidiaBackend(settings, nvml=nvml)
    try:
        devices = await backend.enumerate()
        value = backend.node_annotations(devices).get(score_key("nvidia"))
    except BackendError as exc:
        return Check("step4 topology scores", "FAIL", f"the backend failed: {exc}")
    finally:
        await backend.close()
    option_on = bool(settings.options.get("topology_score", True))
    return compare_scores(smi, topo, value, option_on)


# --------------------------------------------------------------------------- main


@dataclass(frozen=True)
class Options:
    config_path: str | None = None
    nvml: Any = None  # None: the real pynvml
    hami_devices: HamiDevices = hami_devices_subprocess
    plane: ControlPlane | None = None  # None: step 2 starts its own
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def probe(run: Runner = run_command) -> tuple[list[SmiGpu], str]:
    """The GPUs nvidia-smi lists, or none and the reason in words."""
    if shutil.which(SMI_QUERY[0]) is None:
        return [], "nvidia-smi not found"
    ran = run(SMI_QUERY)
    if not ran.ok:
        return [], ran.why()
    try:
        gpus = parse_smi_query(ran.stdout)
    except ValueError as exc:
        return [], str(exc)
    return gpus, "" if gpus else "nvidia-smi lists no GPU"


def nvidia_settings(config_path: str | None) -> BackendSettings:
    """The nvidia backend's settings from the configuration; raises config.ConfigError."""
    cfg = config.load(config_path)
    return cfg.backends.get("nvidia", config.BackendConfig()).settings("nvidia")


async def run_checks(options: Options, smi: Sequence[SmiGpu], settings: BackendSettings) -> Report:
    report = Report()
    topo_ran = run_command(SMI_TOPO)
    topo: Topology | None = None
    topo_why = topo_ran.why()
    if topo_ran.ok:
        try:
            topo = parse_topo(topo_ran.stdout)
        except ValueError as exc:
            topo_why = str(exc)
    report.extend(
        await asyncio.to_thread(
            step1, smi, topo, settings, options.hami_devices, options.config_path
        )
    )

    async def hamicore(answer: Answer) -> list[Check]:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            return await asyncio.to_thread(
                gpucheck_cuda.step3, answer, Path(tmp), options.env, run_command
            )

    smi_uuids = [g.uuid for g in smi]
    report.extend(await step2(settings, smi_uuids, options.nvml, hamicore, options.plane))
    report.extend([await step4_health(settings, options.nvml)])
    report.extend([await step4_topology(settings, options.nvml, smi, topo, topo_why)])
    report.extend(await asyncio.to_thread(gpucheck_mig.step5, options.nvml, run_command))
    return report


async def nvml_problem(options: Options, settings: BackendSettings) -> str | None:
    """Why the NVIDIA backend cannot start NVML here, or None when it can."""
    backend = NvidiaBackend(settings, nvml=options.nvml)
    try:
        await backend.enumerate()
    except BackendError as exc:
        return str(exc)
    finally:
        await backend.close()
    return None


def header(smi: Sequence[SmiGpu], run: Runner = run_command) -> str:
    ran = run(SMI_DRIVER)
    driver = ran.stdout.splitlines()[0].strip() if ran.ok and ran.stdout.strip() else "unknown"
    models = ", ".join(f"GPU{g.index} {g.name} ({g.memory_mib} MiB)" for g in smi)
    return f"gpu-check on {socket.gethostname()}: driver {driver}; {models}"


def main(argv: Sequence[str] | None = None, options: Options | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="hami YAML configuration (default: built-in)")
    parser.add_argument(
        "--log-level", default="error", choices=config.LOG_LEVELS, help="hami's own logs"
    )
    args = parser.parse_args(argv)
    options = options or Options()
    config_path = args.config
    if config_path and not os.path.isabs(config_path):  # gpu-check.sh changed directory
        config_path = os.path.join(options.env.get("GPU_CHECK_CALLER_DIR", "."), config_path)
    options = replace(options, config_path=config_path)
    smi, why = probe()
    if not smi:
        print(f"gpu-check: no NVIDIA GPU here ({why}); nothing to check")
        return 0
    log.configure(args.log_level, "auto", stream=sys.stderr)  # the report goes to stdout
    try:
        settings = nvidia_settings(options.config_path)
        problem = asyncio.run(nvml_problem(options, settings))
    except (config.ConfigError, BackendError) as exc:  # the configuration, not the GPU
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 2
    if problem is not None:
        print(f"gpu-check: nvidia-smi lists {len(smi)} GPU(s) but NVML does not start: {problem}")
        return 1
    print(header(smi))
    report = asyncio.run(run_checks(options, smi, settings))
    for check in report.checks:
        print(check.line())
    print(report.summary())
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
