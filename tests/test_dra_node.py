"""A claim's allocation -> validated slices -> the CDI spec (hami.dra.claims/prepare/cdi):
pure, plus the checkpoint file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.backends.base import BackendSettings, Device
from hami.backends.fake import FakeBackend
from hami.dra import cdi
from hami.dra.checkpoint import Checkpoint
from hami.dra.claims import ClaimError, claim_allocation
from hami.dra.prepare import prepare_claim
from hami.node.allocate import AllocateError, check_entry

NODE = "node-a"
DEVICES = [
    Device("GPU-a-0", 0, "NVIDIA A100", 40960),
    Device("GPU-a-1", 1, "NVIDIA A100", 40960),
]


def backend() -> FakeBackend:
    return FakeBackend(BackendSettings(split_count=4))


def result(device: str, memory: str, cores: str = "0", **extra: Any) -> dict[str, Any]:
    return {
        "request": extra.pop("request", "gpu"),
        "driver": extra.pop("driver", "nvidia.hami.io"),
        "pool": extra.pop("pool", NODE),
        "device": device,
        "consumedCapacity": {"memory": memory, "cores": cores, "slots": "1"},
        "shareID": extra.pop("shareID", "7e57a1c0-0000-4000-8000-000000000001"),
        **extra,
    }


def claim(*results: dict[str, Any], uid: str = "uid-1") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "c1", "uid": uid},
        "status": {
            "allocation": {"devices": {"results": list(results)}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid-1"}],
        },
    }


def allocate(body: dict[str, Any], uid: str = "uid-1") -> Any:
    return claim_allocation(
        body, uid=uid, node=NODE, backend=backend(), node_devices=DEVICES, check=check_entry
    )


def test_cdi_spec_carries_the_hamicore_contract() -> None:
    alloc = allocate(claim(result("nvidia-1", "3000Mi", "30"), result("nvidia-0", "8Gi", "30")))
    assert [d.slice.uuid for d in alloc.devices] == ["GPU-a-1", "GPU-a-0"]
    assert alloc.pod_uid == "pod-uid-1"
    prepared = prepare_claim(alloc, backend(), DEVICES)
    spec = prepared.spec
    assert spec["kind"] == "nvidia.hami.io/claim"
    assert spec["devices"][0]["name"] == "uid-1"
    env = cdi.spec_env(spec)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a-1,GPU-a-0"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "8192m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith("/usr/local/vgpu/")
    mounts = {m["containerPath"]: m for m in spec["devices"][0]["containerEdits"]["mounts"]}
    assert mounts["/usr/local/vgpu/libvgpu.so"]["options"][0] == "ro"
    assert mounts["/usr/local/vgpu"]["hostPath"] == (
        "/usr/local/vgpu/containers/pod-uid-1_claim-c1"
    )
    assert "/tmp/vgpulock" in mounts and "/etc/ld.so.preload" in mounts
    assert prepared.host_dirs == ["/usr/local/vgpu/containers/pod-uid-1_claim-c1"]
    # one CDI id per request, on its first device; each device reports pool, name, share
    assert prepared.devices[0]["cdiDeviceIds"] == ["nvidia.hami.io/claim=uid-1"]
    assert prepared.devices[1]["cdiDeviceIds"] == []
    assert prepared.devices[0]["deviceName"] == "nvidia-1"
    assert prepared.devices[0]["poolName"] == NODE
    assert prepared.devices[0]["shareId"] == "7e57a1c0-0000-4000-8000-000000000001"


def test_other_drivers_results_are_ignored() -> None:
    alloc = allocate(
        claim(result("x-0", "1Mi", driver="other.example.com"), result("nvidia-0", "1Gi"))
    )
    assert [d.device for d in alloc.devices] == ["nvidia-0"]


@pytest.mark.parametrize(
    ("body", "uid", "words"),
    [
        (claim(result("nvidia-0", "1Gi")), "uid-2", "not the 'uid-2'"),
        ({"metadata": {"uid": "uid-1"}, "status": {}}, "uid-1", "not allocated"),
        (claim(result("nvidia-0", "1Gi", driver="x.io")), "uid-1", "no allocation result"),
        (claim(result("nvidia-0", "1Gi", pool="node-b")), "uid-1", "another node"),
        (claim(result("nvidia-7", "1Gi")), "uid-1", "not a nvidia device of this node"),
        (claim(result("nvidia-0", "1500Ki")), "uid-1", "whole number of MiB"),
        (claim({**result("nvidia-0", "1Gi"), "consumedCapacity": {}}), "uid-1", "no consumed"),
    ],
)
def test_bad_allocations_are_refused_with_the_claim_named(
    body: dict[str, Any], uid: str, words: str
) -> None:
    with pytest.raises(ClaimError, match=words):
        allocate(body, uid)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # no timing: 2 shared cores
@given(
    memory=st.integers(min_value=-(10**6), max_value=10**7),
    cores=st.integers(min_value=-1000, max_value=1000),
    device=st.sampled_from(["nvidia-0", "nvidia-1"]),
)
def test_forged_capacity_is_refused_like_the_extender_path(
    memory: int, cores: int, device: str
) -> None:
    """Whatever the claim status says it consumed, only 0..device memory and 0..100 cores
    pass: the same rule (check_entry) the extender path applies to a decision."""
    body = claim(result(device, f"{memory}Mi", str(cores)))
    if 0 <= memory <= 40960 and 0 <= cores <= 100:
        alloc = allocate(body)
        assert alloc.devices[0].slice.memory == memory
    else:
        with pytest.raises((AllocateError, ClaimError)):
            allocate(body)


def test_the_same_device_twice_is_refused() -> None:
    with pytest.raises(AllocateError, match="listed twice"):
        allocate(claim(result("nvidia-0", "1Gi"), result("nvidia-0", "1Gi")))


def test_spec_file_written_atomically_and_removed(tmp_path: Path) -> None:
    alloc = allocate(claim(result("nvidia-0", "1Gi", "50")))
    spec = prepare_claim(alloc, backend(), DEVICES).spec
    path = cdi.write_spec(str(tmp_path), "nvidia.hami.io", "uid-1", spec)
    assert path.name == "nvidia.hami.io-uid-1.json"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    cdi.remove_spec(str(tmp_path), "nvidia.hami.io", "uid-1")
    cdi.remove_spec(str(tmp_path), "nvidia.hami.io", "uid-1")  # twice: no error
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_survives_reload_and_sets_a_corrupt_file_aside(tmp_path: Path) -> None:
    path = tmp_path / "d" / "checkpoint.json"
    first = Checkpoint(path)
    first.load()
    first.put("u1", {"devices": [{"deviceName": "nvidia-0"}], "spec": {}})
    second = Checkpoint(path)
    second.load()
    assert second.claims == {"u1": {"devices": [{"deviceName": "nvidia-0"}], "spec": {}}}
    second.drop("u1")
    third = Checkpoint(path)
    third.load()
    assert third.claims == {}
    path.write_text("{not json")
    broken = Checkpoint(path)
    broken.load()
    assert broken.claims == {}
    assert (tmp_path / "d" / "checkpoint.json.corrupt").exists()
