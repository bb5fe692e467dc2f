"""Interop case (a), issue 10 item 6: Go HAMi's own scheduler places GPU pods on this
project's node agents, and the agents start them through kubelet's Allocate with the limits
Go decided (docs/interop.md).

Runs only with a Go HAMi source tree (``HAMI_SRC``, built once into ~/.cache/hami/hami-go by
scripts/build-hami-go.sh) or a built scheduler (``HAMI_GO_SCHEDULER``); otherwise every test
here is skipped with one line. The cluster: the test control plane, kube-scheduler with Go
HAMi as its extender (as HAMi's chart sets it up), two simulated nodes (node agent with the
fake backend, register value in Go HAMi's JSON form, kubelet emulator).

For each pod shape: Go HAMi binds it; its decision (``hami.io/vgpu-devices-allocated``, as Go
wrote it) names, in order, the devices of the containers that ask for a GPU; kubelet's
Allocate answer for each such container carries exactly those devices
(``NVIDIA_VISIBLE_DEVICES``), the memory per device (``CUDA_DEVICE_MEMORY_LIMIT_i``) and the
core limit (``CUDA_DEVICE_SM_LIMIT``) the pod asked for, and that container's own HAMi-core
host directory and preload (none where it sets ``CUDA_DISABLE_CONTROL=true``); containers
without a GPU get no Allocate call; the pod ends Running with ``hami.io/bind-phase: success``.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _gohami import GoHamiCluster, go_scheduler_binary, go_version, skip_reason

from hami import log
from hami.protocol import ContainerDevice, decode_node_devices, decode_pod_devices, keys
from hami.testkit.cluster import (
    ALLOCATED,
    NodeSpec,
    Timing,
    annotations_of,
    gpu_pod,
    limits,
    phase_of,
)
from hami.testkit.controlplane import ControlPlane

_why = skip_reason()
pytestmark = [
    pytest.mark.skipif(_why is not None, reason=_why or ""),
    pytest.mark.controlplane,
    pytest.mark.asyncio(loop_scope="module"),
    # the first test may build Go HAMi's scheduler (minutes on 2 cores)
    pytest.mark.timeout(1800),
]

T4, A100 = "go-t4", "go-a100"
NODES = (
    NodeSpec(T4, ({"count": 2, "model": "NVIDIA-Tesla T4", "memory": 15360},)),
    NodeSpec(A100, ({"count": 2, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},)),
)
MEMORY = {T4: 15360, A100: 40960}
TIMING = Timing(register_period=2.0)
VGPU_DIR = "/usr/local/vgpu"  # where HAMi-core's host directory is mounted (protocol.md §6)
PRELOAD = "/etc/ld.so.preload"  # absent for a container with CUDA_DISABLE_CONTROL=true


@dataclass(frozen=True)
class Want:
    """What one container asks for: devices, MiB per device (or percent of one), cores."""

    count: int = 1
    mem: int | None = None
    pct: int | None = None
    cores: int | None = None

    def limits(self) -> dict[str, str]:
        return limits(self.count, mem=self.mem, pct=self.pct, cores=self.cores)

    def memory_on(self, device_memory: int) -> int:
        if self.mem is not None:
            return self.mem
        return device_memory * (100 if self.pct is None else self.pct) // 100


@dataclass(frozen=True)
class Shape:
    name: str
    containers: Sequence[Want | None]
    init: Sequence[Want | None] = field(default_factory=tuple)
    #: a container that sets CUDA_DISABLE_CONTROL=true (HAMi-core not preloaded into it)
    no_control: str | None = None

    def pod(self) -> dict[str, Any]:
        pod = gpu_pod(
            self.name,
            [w.limits() if w else {} for w in self.containers],
            init=[w.limits() if w else {} for w in self.init],
        )
        for container in pod["spec"]["containers"]:
            if container["name"] == self.no_control:
                container["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
        return pod

    def named(self) -> list[tuple[str, bool, Want | None]]:
        """(container, is init, want) in the order of the pod's device entries."""
        return [(f"init{i}", True, w) for i, w in enumerate(self.init)] + [
            (f"c{i}", False, w) for i, w in enumerate(self.containers)
        ]


SHAPES = (
    Shape("one-container-mem", [Want(mem=3000)]),
    Shape("count-only", [Want()]),
    Shape("second-container-no-gpu", [None, Want(mem=1500)]),
    Shape("middle-container-no-gpu", [Want(mem=1000), None, Want(mem=2000)]),
    Shape("no-control-after-no-gpu", [None, Want(mem=1000), Want(mem=1000)], no_control="c1"),
    Shape("init-container", [Want(mem=2000)], init=[Want(mem=1000)]),
    Shape("percentage", [Want(pct=50)]),
    Shape("cores", [Want(mem=2000, cores=30)]),
    Shape("two-devices", [Want(count=2, mem=1000)]),
)


@pytest.fixture(scope="module")
def go_binary() -> Path:
    binary, why = go_scheduler_binary()
    if binary is None:
        pytest.skip(why)
    sys.__stderr__.write(f"\nGo HAMi scheduler: {binary} ({go_version(binary)})\n")
    return binary


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane, go_binary: Path) -> AsyncIterator[GoHamiCluster]:
    log.configure("warning", "console", stream=sys.__stderr__)
    async with GoHamiCluster(NODES, go_binary, plane=controlplane, timing=TIMING) as c:
        yield c


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def clean(cluster: GoHamiCluster) -> AsyncIterator[None]:
    yield
    await cluster.delete_pods(wait=True)


async def test_nodes_register_in_go_hamis_form(cluster: GoHamiCluster) -> None:
    """Go HAMi >= 2.8 reads only the JSON form; it holds every device of both nodes."""
    for name, node in cluster.nodes.items():
        value = await cluster.register_value(name)
        assert value.startswith("["), (name, value)
        assert [d.uuid for d in decode_node_devices(value)] == node.uuids
    held = await cluster.go_devices()
    assert {n: held.get(n) for n in cluster.nodes} == {
        n: set(node.uuids) for n, node in cluster.nodes.items()
    }


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
async def test_go_hami_places_and_agent_allocates(cluster: GoHamiCluster, shape: Shape) -> None:
    await cluster.create_pod(shape.pod())
    try:
        pod = await cluster.wait_pod(shape.name, timeout=90)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{cluster.diagnosis()}") from None
    assert phase_of(pod) == "Running", (pod.get("status"), cluster.diagnosis())
    ann = annotations_of(pod)
    node = pod["spec"]["nodeName"]
    assert node in cluster.nodes
    assert ann.get(keys.BIND_PHASE) == "success", ann
    wanting = [(c, init, w) for c, init, w in shape.named() if w is not None]
    decided = go_decision(ann)
    assert len(decided) == len(wanting), (
        f"Go's {ALLOCATED} names devices for {len(decided)} containers, "
        f"the pod has {len(wanting)} asking: {ann.get(ALLOCATED)!r}"
    )
    admission = await cluster.admission(pod)
    assert admission.phase == "Running", (admission.reason, admission.message)
    uuids = set(cluster.nodes[node].uuids)
    for (cname, init, want), devices in zip(wanting, decided, strict=True):
        calls = admission.for_container(cname)
        assert len(calls) == 1 and calls[0].init is init, (cname, calls)
        assert len(devices) == want.count and {d.uuid for d in devices} <= uuids, devices
        memory = want.memory_on(MEMORY[node])
        assert [d.memory for d in devices] == [memory] * want.count, (cname, devices)
        assert [d.cores for d in devices] == [want.cores or 0] * want.count, (cname, devices)
        env = dict(calls[0].response.envs)
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in devices), (cname, env)
        for i in range(want.count):
            assert env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{memory}m", (cname, env)
        assert f"CUDA_DEVICE_MEMORY_LIMIT_{want.count}" not in env, (cname, env)
        assert env["CUDA_DEVICE_SM_LIMIT"] == str(want.cores or 0), (cname, env)
        # HAMi-core's per-container host directory is this container's, not another's
        dirs = [m.host_path for m in calls[0].response.mounts if m.container_path == VGPU_DIR]
        assert [Path(d).name for d in dirs] == [f"{pod['metadata']['uid']}_{cname}"], (cname, dirs)
        preload = [m for m in calls[0].response.mounts if m.container_path == PRELOAD]
        assert len(preload) == (0 if cname == shape.no_control else 1), (cname, preload)
    for cname, _, want in shape.named():
        if want is None:
            assert admission.for_container(cname) == [], cname


def go_decision(ann: Mapping[str, str]) -> list[list[ContainerDevice]]:
    """The non-empty entries of Go's decision, in order (Go HAMi 2.10 leaves out the entries
    of containers that ask for no GPU: protocol.md section 8)."""
    value = ann.get(ALLOCATED) or ""
    return [entry for entry in decode_pod_devices(value) if entry]


async def test_seed_form_node_is_invisible_to_go(cluster: GoHamiCluster) -> None:
    """The default 7-field form is refused whole by Go HAMi >= 2.8 (its reader is JSON only):
    the node is never offered to pods. Why a mixed cluster needs ``register_format: json``."""
    node = await cluster.add_node(NodeSpec("go-seed", NODES[0].devices), register_format="seed")
    try:
        value = await cluster.register_value(node.name)
        assert value and not value.startswith("["), value
        await cluster.wait_go_log("failed to decode node devices", f'node="{node.name}"')
        assert node.name not in await cluster.go_devices()
    finally:
        await cluster.remove_node(node.name)


async def test_burst_of_pods_all_start_within_devices(cluster: GoHamiCluster) -> None:
    """Twelve pods at once: Go HAMi's node lock (written by Go's bind, released by this
    agent after the last Allocate, protocol.md §5) lets every one through, and no device
    holds more than it has."""
    names = [f"burst-{i}" for i in range(12)]
    for name in names:
        await cluster.create_pod(gpu_pod(name, [limits(1, mem=3000)]))
    try:
        pods = await cluster.wait_running(names, timeout=180)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{cluster.diagnosis()}") from None
    used: dict[str, list[int]] = {}
    for name, pod in pods.items():
        assert phase_of(pod) == "Running", (name, pod.get("status"))
        admission = await cluster.admission(pod)
        assert admission.phase == "Running", (name, admission.message)
        (devices,) = go_decision(annotations_of(pod))
        env = dict(admission.for_container("c0")[0].response.envs)
        assert env["NVIDIA_VISIBLE_DEVICES"] == devices[0].uuid
        slot = used.setdefault(devices[0].uuid, [0, 0])
        slot[0], slot[1] = slot[0] + 1, slot[1] + devices[0].memory
    for spec in NODES:
        memory = int(spec.devices[0]["memory"])
        for uuid in cluster.nodes[spec.name].uuids:
            slots, mib = used.get(uuid, [0, 0])
            assert slots <= 10 and mib <= memory, (uuid, slots, mib)
