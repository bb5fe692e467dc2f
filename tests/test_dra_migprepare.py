"""Preparing claims on MIG partitions (hami.dra.migprepare) over the fake NVML, without a
cluster: the claim's allocation is untrusted input (each refusal names the claim and the
fix), the instance is exactly the partition, a prepare after an agent restart adopts the
instance the old agent recorded, a failed later device rolls back the earlier ones, and
unprepare destroys the claim's instances (and says so when one is still in use)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _nvml_helpers import FakeGpu, FakeNvml

from hami.backends.base import BackendError, BackendSettings, Device
from hami.backends.nvidia import NvidiaBackend
from hami.dra import migprepare
from hami.dra.claims import ClaimError
from hami.protocol.mig import MigPlacement

NODE = "node-m"
GPU = "GPU-m-0"
UID = "uid-1"


def backend(nvml: FakeNvml, work: Path) -> NvidiaBackend:
    options: dict[str, Any] = {
        "sysfs_root": str(work),
        "topology_score": False,
        "health_checks": False,
        "operating_mode": "mig",
        "mig_profile_allowlist": [{"models": ["A100"], "profiles": ["1g.5gb", "3g.20gb"]}],
        "mig_state_file": str(work / "ledger.json"),
        "hamicore": {"containers_dir": str(work / "vgpu" / "containers")},
    }
    settings = BackendSettings(split_count=7, options=options, register_format="json")
    return NvidiaBackend(settings, nvml=nvml)


def fake() -> FakeNvml:
    return FakeNvml(
        [FakeGpu(0, GPU, "NVIDIA A100-SXM4-40GB", 40 << 30, "00000000:07:00.0", mig_mode=1)]
    )


def claim(*results: dict[str, Any], uid: str = UID, requests: tuple[str, ...] = ()) -> Any:
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": uid},
        "spec": {"devices": {"requests": [{"name": r} for r in requests]}},
        "status": {
            "allocation": {"devices": {"results": list(results)}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
        },
    }


def result(device: str, request: str = "gpu", **extra: Any) -> dict[str, Any]:
    return {"driver": "nvidia.hami.io", "pool": NODE, "device": device, "request": request, **extra}


def devices(b: NvidiaBackend) -> list[Device]:
    return asyncio.run(b.enumerate())


def prepare(b: NvidiaBackend, body: Any, uid: str = UID) -> Any:
    return migprepare.prepare_mig_claim(
        body, uid=uid, node=NODE, backend=b, node_devices=devices(b)
    )


def test_prepare_makes_exactly_the_partition_and_answers_by_mig_uuid(tmp_path: Path) -> None:
    nvml = fake()
    b = backend(nvml, tmp_path)
    assert migprepare.serves_mig(b, devices(b))
    prepared = prepare(b, claim(result("nvidia-0-mig-3g-20gb-4")))
    ((placement, uuids),) = nvml.live(0).values()
    assert placement == MigPlacement(4, 4)
    (device,) = prepared.spec["devices"]
    assert device["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={uuids[0]}"]
    assert prepared.devices == [
        {
            "requestNames": ["gpu"],
            "poolName": NODE,
            "deviceName": "nvidia-0-mig-3g-20gb-4",
            "cdiDeviceIds": [f"nvidia.hami.io/claim={UID}"],
        }
    ]
    (entry,) = b.mig.ledger
    assert (entry.pod_uid, entry.made) == (UID, True)  # owned by the claim
    # unprepare destroys it; a second unprepare finds nothing and asks NVML nothing
    assert migprepare.release_claim(b, UID) == []
    assert nvml.live(0) == {} and len(b.mig.ledger) == 0
    assert migprepare.release_claim(b, UID) == []


def test_a_restarted_agent_adopts_what_the_old_one_made(tmp_path: Path) -> None:
    nvml = fake()
    first = prepare(backend(nvml, tmp_path), claim(result("nvidia-0-mig-1g-5gb-6")))
    created = list(nvml.created)
    again = prepare(backend(nvml, tmp_path), claim(result("nvidia-0-mig-1g-5gb-6")))
    assert nvml.created == created  # nothing made twice
    assert again.spec == first.spec


def test_a_failed_second_device_rolls_back_the_first(tmp_path: Path) -> None:
    nvml = fake()
    b = backend(nvml, tmp_path)
    nvml.add_instance(0, 0, 0)  # an operator's 1g instance at slice 0
    body = claim(result("nvidia-0-mig-3g-20gb-4", "a"), result("nvidia-0-mig-1g-5gb-0", "b"))
    with pytest.raises(BackendError, match="this agent did not make"):
        prepare(b, body)
    assert [p for p, _ in nvml.live(0).values()] == [MigPlacement(0, 1)]  # only the operator's
    assert len(b.mig.ledger) == 0


def test_unprepare_reports_an_instance_in_use(tmp_path: Path) -> None:
    nvml = fake()
    b = backend(nvml, tmp_path)
    prepare(b, claim(result("nvidia-0-mig-1g-5gb-6")))
    ((_, uuids),) = nvml.live(0).values()
    nvml.busy.add(uuids[0])
    (problem,) = migprepare.release_claim(b, UID)
    assert "claim ns/c" in problem
    nvml.busy.clear()
    assert migprepare.release_claim(b, UID) == [] and nvml.live(0) == {}


@pytest.mark.parametrize(
    ("body", "uid", "message"),
    [
        (claim(result("nvidia-0-mig-1g-5gb-6")), "other", "is not the 'other' kubelet asked"),
        ({"metadata": {"namespace": "ns", "name": "c", "uid": UID}}, UID, "not allocated"),
        (claim({**result("nvidia-0-mig-1g-5gb-6"), "driver": "x"}), UID, "no allocation result"),
        (claim({**result("nvidia-0-mig-1g-5gb-6"), "pool": "n2"}), UID, "another node"),
        (claim(result("nvidia-0")), UID, "is not a MIG partition of this node"),
        (claim(result("nvidia-0-mig-2g-10gb-0")), UID, "is not a MIG partition"),
        (
            claim(result("nvidia-0-mig-1g-5gb-6", adminAccess=True), requests=("gpu",)),
            UID,
            "admin access to a MIG partition is not supported",
        ),
        (
            claim(result("nvidia-0-mig-1g-5gb-6"), result("nvidia-0-mig-1g-5gb-6", "b")),
            UID,
            "allocated twice",
        ),
    ],
)
def test_untrusted_allocations_are_refused_naming_the_claim(
    tmp_path: Path, body: Any, uid: str, message: str
) -> None:
    nvml = fake()
    with pytest.raises(ClaimError, match=message) as refused:
        prepare(backend(nvml, tmp_path), body, uid)
    assert "ResourceClaim ns/c" in str(refused.value)
    assert nvml.created == []  # nothing made for a refused claim
