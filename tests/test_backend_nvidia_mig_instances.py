"""The NVIDIA backend realises MIG reservations (issue 23 item 3) on the fake NVML: exactly
the reserved GPU and compute instance, adopted again on a retry or by a restarted agent,
removed once the pod is gone and never an instance it did not make; bad input is a clear
error naming the fix. The modes: a mig node answers with MIG UUIDs only, a hami-core node
refuses MIG reservations and clears what it made in mig mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pynvml
import pytest
from _nvml_helpers import FakeGpu, FakeNvml
from structlog.testing import capture_logs

from hami.backends import BackendError, BackendSettings
from hami.backends.base import AllocationRequest, Device
from hami.backends.nvidia import NvidiaBackend
from hami.node.allocate import AllocateError, plan_allocation
from hami.protocol import ContainerDevice, encode_pod_devices, keys
from hami.protocol.mig import (
    MIG_ALLOCATIONS_KEY,
    MigAllocation,
    MigPlacement,
    decode_mig_allocations,
    encode_mig_allocations,
)

ALLOW = [{"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]}]
GPU0, GPU1 = "GPU-a-0", "GPU-a-1"
TO_ALLOC = "hami.io/vgpu-devices-to-allocate"


def gpus() -> list[FakeGpu]:
    return [
        FakeGpu(i, f"GPU-a-{i}", "A100-SXM4-40GB", 40960 * 2**20, f"00000000:0{i}:00.0", 0, None)
        for i in range(2)
    ] + [FakeGpu(2, "GPU-a-2", "A100-SXM4-40GB", 40960 * 2**20, "00000000:09:00.0", mig_mode=0)]


def with_mig(nvml_gpus: list[FakeGpu]) -> list[FakeGpu]:
    for gpu in nvml_gpus[:2]:
        gpu.mig_mode = 1
    return nvml_gpus


def backend(nvml: FakeNvml, tmp: Path, mode: str = "mig") -> NvidiaBackend:
    options: dict[str, Any] = {
        "sysfs_root": str(tmp),
        "topology_score": False,
        "health_checks": False,
        "operating_mode": mode,
        "mig_profile_allowlist": ALLOW,
        "mig_state_file": str(tmp / "state" / "mig.json"),
    }
    return NvidiaBackend(BackendSettings(options=options, register_format="json"), nvml=nvml)


def reservation(
    gpu: str = GPU0, profile: str = "3g.20gb", start: int = 4, size: int = 4, container: int = 0
) -> MigAllocation:
    return MigAllocation(container, 0, gpu, profile, MigPlacement(start, size))


def request(
    allocations: list[MigAllocation] | str | None,
    devices: list[str] | None = None,
    uid: str = "uid-p",
    container: int = 0,
) -> AllocationRequest:
    annotations: dict[str, str] = {}
    if isinstance(allocations, str):
        annotations[MIG_ALLOCATIONS_KEY] = allocations
    elif allocations is not None:
        annotations[MIG_ALLOCATIONS_KEY] = encode_mig_allocations(allocations)
    return AllocationRequest(
        pod_namespace="ns",
        pod_name=f"p-{uid}",
        pod_uid=uid,
        container_name="c0",
        container_index=container,
        devices=[ContainerDevice(u, "NVIDIA", 19968, 43) for u in devices or [GPU0]],
        node_devices=[],
        pod_annotations=annotations,
    )


def pod(name: str, allocations: list[MigAllocation] | None, phase: str = "Running") -> Any:
    annotations = (
        {} if allocations is None else {MIG_ALLOCATIONS_KEY: encode_mig_allocations(allocations)}
    )
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "annotations": annotations,
        },
        "status": {"phase": phase},
    }


def written(answer: Any) -> list[MigAllocation]:
    return decode_mig_allocations(answer.pod_annotations[MIG_ALLOCATIONS_KEY])


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml(with_mig(gpus()))


async def test_allocate_makes_exactly_the_reserved_instance(nvml: FakeNvml, tmp_path: Path) -> None:
    nvidia = backend(nvml, tmp_path)
    assert nvidia.allocate_does_io
    answer = nvidia.allocate(request([reservation()]))
    ((gi_id, placement, uuids),) = [(g, p, u) for g, (p, u) in nvml.live(0).items()]
    assert placement == MigPlacement(4, 4) and nvml.created == [(0, gi_id, placement)]
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": uuids[0]}  # no HAMi-core
    assert not answer.mounts and not answer.host_dirs
    (done,) = written(answer)
    assert (done.mig_uuid, done.gpu_instance_id, done.compute_instance_id) == (uuids[0], gi_id, 0)
    # Go's bytes: the five reserved keys, then the three the node adds (0 written too)
    assert answer.pod_annotations[MIG_ALLOCATIONS_KEY] == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a-0","profile":"3g.20gb",'
        f'"placement":{{"start":4,"size":4}},"migUUID":"{uuids[0]}","gpuInstanceID":{gi_id},'
        '"computeInstanceID":0}]'
    )
    (entry,) = json.loads((tmp_path / "state" / "mig.json").read_text())["instances"]
    assert (entry["pod_uid"], entry["made"], entry["mig_uuid"]) == ("uid-p", True, uuids[0])


async def test_a_retry_and_a_restarted_agent_adopt_the_instance(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    first = backend(nvml, tmp_path).allocate(request([reservation()]))
    again = backend(nvml, tmp_path).allocate(request([reservation()]))  # same ledger file
    retried = backend(nvml, tmp_path)
    assert retried.allocate(request([reservation()])).envs == first.envs == again.envs
    assert len(nvml.created) == 1 and not nvml.destroyed
    # the ledger lost: the pod's completed reservation names the live instance, so it is adopted
    (tmp_path / "state" / "mig.json").unlink()
    lost = backend(nvml, tmp_path)
    assert lost.allocate(request(written(first))).envs == first.envs
    assert len(nvml.created) == 1


async def test_an_agent_killed_between_the_creates_finishes_its_instance(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    nvml.fail["nvmlGpuInstanceCreateComputeInstance"] = pynvml.NVML_ERROR_UNKNOWN
    nvidia = backend(nvml, tmp_path)
    with pytest.raises(BackendError, match=r"NVML failed on the MIG instance 3g\.20gb"):
        nvidia.allocate(request([reservation()]))
    assert nvml.live(0) == {} and len(nvidia.mig.ledger) == 0  # rolled back
    # as if the agent died after the GPU instance: the intent is on disk, the GI live
    del nvml.fail["nvmlGpuInstanceCreateComputeInstance"]
    gi_id = nvml.add_instance(0, 2, 4, with_ci=False)
    state = tmp_path / "state" / "mig.json"
    state.write_text(
        json.dumps(
            {
                "version": 1,
                "instances": [
                    {
                        "gpu_uuid": GPU0,
                        "start": 4,
                        "size": 4,
                        "profile": "3g.20gb",
                        "profile_id": 2,
                        "pod_uid": "uid-p",
                        "pod": "ns/p",
                    }
                ],
            }
        )
    )
    answer = backend(nvml, tmp_path).allocate(request([reservation()]))
    (done,) = written(answer)
    assert done.gpu_instance_id == gi_id and nvml.live(0)[gi_id][1] == [done.mig_uuid]


async def test_the_reconciler_removes_instances_of_gone_pods_only(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    nvidia = backend(nvml, tmp_path)
    kept = reservation(start=0)
    nvidia.allocate(request([kept], uid="uid-a"))
    nvidia.allocate(request([reservation(start=4)], uid="uid-b"))
    foreign = nvml.add_instance(1, 0, 6)  # an operator's 1g instance on GPU 1
    assert nvidia.wants_pod_reconcile()
    await nvidia.reconcile_pods([pod("a", [kept]), pod("c", None, phase="Succeeded")])
    assert [p for p, _ in nvml.live(0).values()] == [MigPlacement(0, 4)]
    assert foreign in nvml.live(1)
    # a failed pod's instance goes; an unreadable annotation keeps the pod's instances
    garbled = pod("a", None)
    garbled["metadata"]["annotations"][MIG_ALLOCATIONS_KEY] = "{not json"
    await nvidia.reconcile_pods([garbled])
    assert len(nvml.live(0)) == 1
    await nvidia.reconcile_pods([pod("a", [kept], phase="Failed")])
    assert nvml.live(0) == {} and foreign in nvml.live(1) and len(nvidia.mig.ledger) == 0


async def test_an_instance_in_use_is_kept_and_removed_later(nvml: FakeNvml, tmp_path: Path) -> None:
    nvidia = backend(nvml, tmp_path)
    (done,) = written(nvidia.allocate(request([reservation()])))
    nvml.busy.add(done.mig_uuid)
    with capture_logs() as logs:
        await nvidia.reconcile_pods([])
    assert len(nvml.live(0)) == 1 and len(nvidia.mig.ledger) == 1
    assert any(e["event"] == "nvidia.mig_instance_kept" for e in logs)
    nvml.busy.clear()
    await nvidia.reconcile_pods([])
    assert nvml.live(0) == {} and len(nvidia.mig.ledger) == 0


async def test_a_restarted_agent_without_its_ledger_adopts_from_the_pods(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    (done,) = written(backend(nvml, tmp_path).allocate(request([reservation()], uid="uid-a")))
    (tmp_path / "state" / "mig.json").unlink()
    nvidia = backend(nvml, tmp_path)
    await nvidia.reconcile_pods([pod("a", [done])])
    assert len(nvidia.mig.ledger) == 1
    await nvidia.reconcile_pods([])
    assert nvml.live(0) == {}


@pytest.mark.parametrize(
    ("setup", "allocations", "message"),
    [
        (None, None, "no hami.io/vgpu-mig-allocations on the pod"),
        (None, "[{", "hami.io/vgpu-mig-allocations"),
        (None, [reservation(start=3)], "not a legal placement of 3g.20gb"),
        (None, [reservation(gpu=GPU1)], "gives it GPU GPU-a-0"),
        (None, [reservation(container=1)], "reserves 0 MIG instance"),
        ("foreign", [reservation()], "which this agent did not make; it may be in use"),
        ("overlap", [reservation()], "overlaps GPU instance"),
        ("no-mig", [reservation()], "is not in MIG mode"),
        ("lost", [reservation(gpu="GPU-zz")], "not on this node"),
    ],
)
def test_bad_input_is_a_clear_error(
    nvml: FakeNvml, tmp_path: Path, setup: str | None, allocations: Any, message: str
) -> None:
    if setup == "foreign":
        gi_id = nvml.add_instance(0, 2, 4)
        message += f".*nvidia-smi mig -i 0 -dci -gi {gi_id}"
    elif setup == "overlap":
        nvml.add_instance(0, 0, 5)
    elif setup == "no-mig":
        nvml.gpus[0].mig_mode = 0
    devices = ["GPU-zz"] if setup == "lost" else None
    with pytest.raises(BackendError, match=message):
        backend(nvml, tmp_path).allocate(request(allocations, devices))
    assert all(not nvml.live(i) or setup in ("foreign", "overlap") for i in range(2))


def test_two_pods_on_one_placement_are_refused(nvml: FakeNvml, tmp_path: Path) -> None:
    nvidia = backend(nvml, tmp_path)
    nvidia.allocate(request([reservation()], uid="uid-a"))
    with pytest.raises(BackendError, match="made for pod ns/p-uid-a, which is still on this"):
        nvidia.allocate(request([reservation()], uid="uid-b"))


def test_a_failing_second_device_rolls_back_the_first(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.gpus[1].mig_mode = 0
    two = [reservation(), MigAllocation(0, 1, GPU1, "1g.5gb", MigPlacement(6, 1))]
    with pytest.raises(BackendError, match=r"GPU GPU-a-1 .* is not in MIG mode"):
        backend(nvml, tmp_path).allocate(request(two, [GPU0, GPU1]))
    assert nvml.live(0) == {} and len(nvml.created) == 1 and len(nvml.destroyed) == 1


def test_a_ledger_that_cannot_be_written_stops_before_nvml(nvml: FakeNvml, tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file where the directory should be")
    with pytest.raises(BackendError, match="cannot record the MIG instance"):
        backend(nvml, tmp_path).allocate(request([reservation()]))
    assert nvml.created == []


async def test_hami_core_mode_refuses_mig_and_clears_what_mig_mode_made(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    backend(nvml, tmp_path).allocate(request([reservation()], uid="uid-a"))
    core = backend(nvml, tmp_path, mode="hami-core")
    assert not core.allocate_does_io and core.wants_pod_reconcile()
    with pytest.raises(BackendError, match="operating_mode: hami-core"):
        core.allocate(request([reservation()], devices=["GPU-a-2"]))
    plain = core.allocate(request(None, devices=["GPU-a-2"]))
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" in plain.envs  # HAMi-core as ever
    with capture_logs() as logs:
        await core.reconcile_pods([pod("a", [reservation()])])  # its pod still runs
        await core.reconcile_pods([])
    events = [e["event"] for e in logs]
    assert events.index("nvidia.mig_instances_remain") < events.index(
        "nvidia.mig_instances_cleared"
    )
    assert nvml.live(0) == {} and not core.wants_pod_reconcile()


def test_plan_writes_every_containers_instance_back(nvml: FakeNvml, tmp_path: Path) -> None:
    """Two containers in one Allocate: the second sees the first's completed reservation, and
    the pod patch carries both, beside the erased devices value."""
    nvidia = backend(nvml, tmp_path)
    reserved = [reservation(start=0, container=0), reservation(gpu=GPU1, container=1)]
    entries = [
        [ContainerDevice(GPU0, "NVIDIA", 19968, 43)],
        [ContainerDevice(GPU1, "NVIDIA", 19968, 43)],
    ]
    the_pod = {
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "uid": "uid-p",
            "annotations": {
                TO_ALLOC: encode_pod_devices(entries),
                MIG_ALLOCATIONS_KEY: encode_mig_allocations(reserved),
            },
        },
        "spec": {"containers": [{"name": "c0"}, {"name": "c1"}]},
    }
    devices = [Device(GPU0, 0, "NVIDIA-A100-SXM4-40GB", 40960), Device(GPU1, 1, "x", 40960)]
    plan = plan_allocation(the_pod, nvidia, [1, 1], devices)
    done = decode_mig_allocations(plan.annotations[MIG_ALLOCATIONS_KEY])
    assert all(a.mig_uuid for a in done) and plan.annotations[keys.BIND_PHASE] == "success"
    assert [c.allocation.envs["NVIDIA_VISIBLE_DEVICES"] for c in plan.containers] == [
        a.mig_uuid for a in done
    ]
    with pytest.raises(AllocateError, match=r"pod ns/p: .*no hami.io/vgpu-mig-allocations"):
        del the_pod["metadata"]["annotations"][MIG_ALLOCATIONS_KEY]
        plan_allocation(the_pod, nvidia, [1, 1], devices)
