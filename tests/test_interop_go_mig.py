"""Interop, issue 23: Go HAMi v2.10's own scheduler places MIG pods on this project's node
agent in ``operating_mode: mig`` (docs/interop.md).

Runs only with a Go HAMi source tree (``HAMI_SRC``) or a built scheduler
(``HAMI_GO_SCHEDULER``), like tests/test_interop_go.py; otherwise skipped with one line. The
cluster: the test control plane, kube-scheduler with Go HAMi as its extender, one node whose
agent runs the real NVIDIA backend in MIG mode over the fake NVML (one A100 40 GB,
``hami.testkit.mig_node``) and one HAMi-core node (a T4 on the fake backend).

What is proven: Go reads the MIG capability this agent registers; a pod with
``nvidia.com/vgpu-mode: mig`` and a memory request is placed by Go on the MIG GPU (never on
the HAMi-core one), with the profile and placement Go chose written by Go into
``hami.io/vgpu-mig-allocations``; kubelet's Allocate (real device-plugin gRPC through the
kubelet emulator) makes exactly that GPU instance and answers with its MIG UUID; a GPU
with no free placement leaves the next pod Pending, and deleting a pod removes its instance
and lets the pending one in. The other direction (this scheduler reading the register of
Go's own device plugin on a MIG node) is proven on Go's own bytes by
tests/test_mig_go_vectors.py (register_decode).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_asyncio
from _gohami import GoHamiCluster, go_scheduler_binary, go_version, skip_reason

from hami import log
from hami.protocol import decode_node_devices, decode_pod_devices, keys
from hami.protocol.mig import (
    MIG_MODE,
    MigAllocation,
    MigPlacement,
    MigProfile,
    decode_mig_allocations,
    select_mig_profile,
)
from hami.testkit.cluster import (
    ALLOCATED,
    NodeSpec,
    Timing,
    annotations_of,
    gpu_pod,
    limits,
    phase_of,
    poll,
)
from hami.testkit.controlplane import ControlPlane
from hami.testkit.fake_nvml import FakeNvml

_why = skip_reason()
pytestmark = [
    pytest.mark.skipif(_why is not None, reason=_why or ""),
    pytest.mark.controlplane,
    pytest.mark.asyncio(loop_scope="module"),
    # the first test may build Go HAMi's scheduler (minutes on 2 cores)
    pytest.mark.timeout(1800),
]

MIG_NODE, CORE_NODE = "go-a100-mig", "go-t4-core"
NODES = (
    NodeSpec(
        MIG_NODE, ({"count": 1, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},), mode="mig"
    ),
    NodeSpec(CORE_NODE, ({"count": 1, "model": "NVIDIA-Tesla T4", "memory": 15360},)),
)
TIMING = Timing(register_period=2.0)
MIG_ON = {"nvidia.com/vgpu-mode": "mig"}
CORE_ON = {"nvidia.com/vgpu-mode": "hami-core"}
#: MiB asked in turn: 3g.20gb, 2g.10gb, 1g.5gb, 1g.5gb (every memory slice taken)
ASKS = (18000, 9000, 4000, 4000)


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


def fake_nvml(cluster: GoHamiCluster) -> FakeNvml:
    """The fake NVML under the MIG node's NVIDIA backend (to see the instances it made)."""
    return cast(FakeNvml, cluster.nodes[MIG_NODE].backend._nvml)  # type: ignore[attr-defined]


async def registered_profiles(cluster: GoHamiCluster) -> tuple[MigProfile, ...]:
    (device,) = decode_node_devices(await cluster.register_value(MIG_NODE))
    return device.mig_profiles


async def test_mig_capability_is_held_by_go(cluster: GoHamiCluster) -> None:
    """The MIG GPU is registered in Go's form (mode mig, the allow-list's profiles) and Go
    holds it, beside the HAMi-core node's device."""
    (device,) = decode_node_devices(await cluster.register_value(MIG_NODE))
    assert device.mode == MIG_MODE and device.uuid == cluster.nodes[MIG_NODE].uuids[0]
    assert [p.name for p in device.mig_profiles] == ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
    held = await cluster.go_devices()
    assert held.get(MIG_NODE) == set(cluster.nodes[MIG_NODE].uuids), held
    assert held.get(CORE_NODE) == set(cluster.nodes[CORE_NODE].uuids), held


async def test_go_places_mig_pods_and_the_agent_makes_each_instance(
    cluster: GoHamiCluster,
) -> None:
    profiles = await registered_profiles(cluster)
    gpu = cluster.nodes[MIG_NODE].uuids[0]
    nvml = fake_nvml(cluster)
    occupied: list[MigPlacement] = []
    placed: dict[str, MigAllocation] = {}
    for i, ask in enumerate(ASKS):
        expected = select_mig_profile(profiles, occupied, ask)
        assert expected is not None, f"the case expects {ask} MiB to fit after {occupied}"
        name = f"mig-{i}"
        await cluster.create_pod(gpu_pod(name, [limits(1, mem=ask)], annotations=MIG_ON))
        pod = await _running(cluster, name)
        assert pod["spec"]["nodeName"] == MIG_NODE
        allocation = await _check_instance(cluster, pod, gpu, nvml, expected)
        occupied.append(allocation.placement)
        placed[name] = allocation
    # every memory slice is taken (4 + 2 + 1 + 1): no profile fits any more
    assert sum(p.size for p in occupied) == 8
    assert select_mig_profile(profiles, occupied, 1) is None
    live = {pl: uuids for pl, uuids in nvml.live(0).values()}
    assert live == {a.placement: [a.mig_uuid] for a in placed.values()}

    # one more MIG pod: Go refuses it (the HAMi-core GPU is not MIG; the MIG GPU is full,
    # which Go's memory check finds before its MIG placement check)
    await cluster.create_pod(gpu_pod("mig-late", [limits(1, mem=4000)], annotations=MIG_ON))
    await cluster.wait_go_log("FilteringFailed", f"CardTypeMismatch({CORE_NODE})")
    await cluster.wait_go_log("FilteringFailed", f"CardInsufficientMemory({MIG_NODE})")
    late = await cluster.get_pod("mig-late")
    assert phase_of(late) == "Pending" and not late["spec"].get("nodeName"), late.get("status")

    # a pod goes: the agent removes its instance, and Go places the late pod in its slice
    gone = placed.pop("mig-2")
    await cluster.delete_pod("mig-2")
    await poll(
        lambda: gone.placement not in [pl for pl, _ in nvml.live(0).values()],
        60,
        "the agent removing the deleted pod's instance",
    )
    pod = await _running(cluster, "mig-late", timeout=120)
    again = select_mig_profile(profiles, [a.placement for a in placed.values()], 4000)
    assert again is not None and again[1] == gone.placement
    allocation = await _check_instance(cluster, pod, gpu, nvml, again)
    assert allocation.mig_uuid != gone.mig_uuid
    live = {pl: uuids for pl, uuids in nvml.live(0).values()}
    assert live == {a.placement: [a.mig_uuid] for a in [*placed.values(), allocation]}


async def test_a_hami_core_pod_keeps_off_the_mig_gpu(cluster: GoHamiCluster) -> None:
    """``vgpu-mode: hami-core`` is placed on the HAMi-core GPU, and no instance is made."""
    nvml = fake_nvml(cluster)
    made = len(nvml.created)
    await cluster.create_pod(gpu_pod("core", [limits(1, mem=3000)], annotations=CORE_ON))
    pod = await _running(cluster, "core")
    assert pod["spec"]["nodeName"] == CORE_NODE
    assert keys.MIG_ALLOCATIONS not in annotations_of(pod)
    admission = await cluster.admission(pod)
    env = dict(admission.for_container("c0")[0].response.envs)
    assert env["NVIDIA_VISIBLE_DEVICES"] == cluster.nodes[CORE_NODE].uuids[0]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert len(nvml.created) == made


async def _running(cluster: GoHamiCluster, name: str, timeout: float = 90) -> dict[str, Any]:  # noqa: ASYNC109
    try:
        pod = await cluster.wait_pod(name, timeout=timeout)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{cluster.diagnosis()}") from None
    assert phase_of(pod) == "Running", (pod.get("status"), cluster.diagnosis())
    assert annotations_of(pod).get(keys.BIND_PHASE) == "success", annotations_of(pod)
    return pod


async def _check_instance(
    cluster: GoHamiCluster,
    pod: dict[str, Any],
    gpu: str,
    nvml: FakeNvml,
    expected: tuple[MigProfile, MigPlacement],
) -> MigAllocation:
    """Go's reservation is the profile and placement Go HAMi 2.10 picks (the same choice
    as select_mig_profile), the agent made that instance, and the container sees it."""
    profile, placement = expected
    ann = annotations_of(pod)
    (allocation,) = decode_mig_allocations(ann[keys.MIG_ALLOCATIONS])
    assert (allocation.container_index, allocation.device_index) == (0, 0), allocation
    assert allocation.gpu_uuid == gpu, allocation
    assert (allocation.profile, allocation.placement) == (profile.name, placement), allocation
    # Go's devices value carries the profile's memory and cores
    ((device,),) = [entry for entry in decode_pod_devices(ann[ALLOCATED]) if entry]
    assert (device.uuid, device.memory, device.cores) == (gpu, profile.memory_mb, profile.core)
    # the agent completed the reservation with the instance it made, at that placement
    assert allocation.mig_uuid.startswith("MIG-"), allocation
    instances = {pl: uuids for pl, uuids in nvml.live(0).values()}
    assert instances.get(placement) == [allocation.mig_uuid], (placement, instances)
    admission = await cluster.admission(pod)
    assert admission.phase == "Running", (admission.reason, admission.message)
    (call,) = admission.for_container("c0")
    assert dict(call.response.envs) == {"NVIDIA_VISIBLE_DEVICES": allocation.mig_uuid}
    assert not call.response.mounts  # no HAMi-core on a MIG instance
    return allocation
