"""Admin-access claims in the DRA mode (issue 22 item 4), pure parts: the node side reads an
``adminAccess: true`` result for its device only and prepares it without HAMi-core (no
limits, no usage-cache directory, no preload), refuses what it cannot honour, and the
DRA-mode score neither counts such a result as a hold nor weighs such a request."""

from __future__ import annotations

from typing import Any

import pytest

from hami.backends.base import AllocationRequest, BackendError, BackendSettings, Device
from hami.backends.cambricon import CambriconBackend
from hami.backends.fake import FakeBackend
from hami.backends.nvidia import NvidiaBackend
from hami.core.requests import DeviceKind
from hami.dra import cdi, inventory, podrequest
from hami.dra.claims import ClaimError, claim_allocation
from hami.dra.prepare import prepare_claim
from hami.node.allocate import AllocateError, check_entry
from hami.protocol import ContainerDevice
from hami.testkit.dra_pods import claim_template, dra_pod

NODE = "node-a"
DEVICES = [
    Device("GPU-a-0", 0, "NVIDIA A100", 40960),
    Device("GPU-a-1", 1, "NVIDIA A100", 40960),
]
DRIVER = "nvidia.hami.io"
HAMICORE_ENV = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED")


def backend() -> FakeBackend:
    return FakeBackend(BackendSettings(split_count=4))


def result(
    device: str, *, admin: bool = True, request: str = "mon", **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "request": request,
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "shareID": "7e57a1c0-0000-4000-8000-000000000002",
        # kube-scheduler records what the request asked even for admin access
        "consumedCapacity": {"memory": "1Mi", "cores": "0", "slots": "1"},
        **extra,
    }
    if admin:
        body["adminAccess"] = True
    return body


def request(name: str, *, admin: bool = True, all_devices: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if admin:
        exactly["adminAccess"] = True
    if all_devices:
        exactly["allocationMode"] = "All"
    return {"name": name, "exactly": exactly}


def claim(
    results: list[dict[str, Any]], requests: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "mon", "name": "watch", "uid": "uid-a"},
        "spec": {"devices": {"requests": requests or [request("mon", all_devices=True)]}},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid-a"}],
        },
    }


def allocate(body: dict[str, Any]) -> Any:
    return claim_allocation(
        body, uid="uid-a", node=NODE, backend=backend(), node_devices=DEVICES, check=check_entry
    )


# ------------------------------------------------------------------ node side


def test_admin_claim_gets_the_devices_and_nothing_of_hamicore() -> None:
    alloc = allocate(claim([result("nvidia-0"), result("nvidia-1")]))
    assert alloc.admin_access
    # the recorded 1Mi is not held: no limit is made of it
    assert [(d.slice.uuid, d.slice.memory, d.slice.cores) for d in alloc.devices] == [
        ("GPU-a-0", 0, 0),
        ("GPU-a-1", 0, 0),
    ]
    prepared = prepare_claim(alloc, backend(), DEVICES)
    edits = prepared.spec["devices"][0]["containerEdits"]
    assert cdi.spec_env(prepared.spec) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a-0,GPU-a-1"}
    assert not any(key.startswith(HAMICORE_ENV) for key in cdi.spec_env(prepared.spec))
    # no libvgpu, no preload, no cache directory, no lock directory: not a tenant
    assert "mounts" not in edits
    assert prepared.host_dirs == []
    # kubelet's answer is the same shape as for any claim
    assert [d["deviceName"] for d in prepared.devices] == ["nvidia-0", "nvidia-1"]
    assert prepared.devices[0]["cdiDeviceIds"] == ["nvidia.hami.io/claim=uid-a"]
    assert prepared.devices[0]["shareId"] == "7e57a1c0-0000-4000-8000-000000000002"


def test_admin_result_needs_no_consumed_capacity() -> None:
    bare = result("nvidia-1")
    del bare["consumedCapacity"]
    alloc = allocate(claim([bare]))
    assert alloc.admin_access and alloc.devices[0].slice.memory == 0


def test_admin_access_must_be_a_literal_true() -> None:
    """Only ``true`` turns the limits off; anything else is an ordinary result."""
    odd = result("nvidia-0", admin=False, adminAccess="true")
    odd["consumedCapacity"]["memory"] = "2000Mi"
    alloc = allocate(claim([odd], [request("mon", admin=False)]))
    assert not alloc.admin_access
    env = cdi.spec_env(prepare_claim(alloc, backend(), DEVICES).spec)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"


def test_ordinary_claim_keeps_its_limits() -> None:
    body = claim([result("nvidia-0", admin=False)], [request("mon", admin=False)])
    alloc = allocate(body)
    assert not alloc.admin_access
    env = cdi.spec_env(prepare_claim(alloc, backend(), DEVICES).spec)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1m"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        # the result says admin access, the (immutable, admitted) spec does not ask for it
        (claim([result("nvidia-0")], [request("mon", admin=False)]), "does not ask for it"),
        (claim([result("nvidia-0", request="other")]), "does not ask for it"),
        (
            claim(
                [result("nvidia-0"), result("nvidia-1", admin=False, request="work")],
                [request("mon"), request("work", admin=False)],
            ),
            "mixes admin-access requests \\(mon\\) with ordinary ones",
        ),
        (claim([result("nvidia-5")]), "not a nvidia device of this node"),
        (claim([result("nvidia-0", pool="node-b")]), "another node"),
        (claim([result("nvidia-0"), result("nvidia-0")]), "listed twice"),
    ],
)
def test_admin_claims_that_cannot_be_honoured_are_refused(body: dict[str, Any], words: str) -> None:
    with pytest.raises((ClaimError, AllocateError), match=words):
        allocate(body)


def admin_request() -> AllocationRequest:
    return AllocationRequest(
        pod_namespace="mon",
        pod_name="watch",
        pod_uid="pod-uid-a",
        container_name="claim-watch",
        container_index=0,
        devices=[ContainerDevice("GPU-a-1", "NVIDIA", 0, 0)],
        node_devices=DEVICES,
    )


def test_nvidia_admin_allocation_is_visibility_only() -> None:
    answer = NvidiaBackend(BackendSettings()).admin_allocation(admin_request())
    assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a-1"}
    assert not answer.mounts and not answer.devices and not answer.host_dirs


def test_a_backend_without_admin_allocation_refuses() -> None:
    with pytest.raises(BackendError, match="does not prepare admin-access claims"):
        CambriconBackend(BackendSettings()).admin_allocation(admin_request())


# ------------------------------------------------------------------ score side


def allocated(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "c"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def test_admin_results_hold_nothing_in_the_inventory() -> None:
    drivers = {DRIVER: "nvidia"}
    holds = inventory.claim_holds(allocated([result("nvidia-0"), result("nvidia-1")]), drivers)
    assert holds.usage == {} and holds.errors == ()
    # without consumed capacity an ordinary result holds the whole device; an admin one
    # still holds nothing (kube-scheduler skips it before reading its capacity)
    bare = result("nvidia-0")
    del bare["consumedCapacity"]
    assert inventory.claim_holds(allocated([bare]), drivers).usage == {}
    ordinary = result("nvidia-1", admin=False, adminAccess=False)
    ordinary["consumedCapacity"]["memory"] = "3000Mi"
    mixed = inventory.claim_holds(allocated([result("nvidia-0"), ordinary]), drivers)
    assert set(mixed.usage[NODE]) == {"nvidia-1"}
    assert mixed.usage[NODE]["nvidia-1"].memory == 3000


def test_admin_requests_are_not_weighed() -> None:
    kind = DeviceKind.from_backend(backend())
    classes = {DRIVER: kind}
    admin = claim_template("mon")
    admin["spec"]["spec"]["devices"]["requests"][0]["exactly"].update(
        adminAccess=True, allocationMode="All"
    )
    templates = {"ns/mon": admin, "ns/work": claim_template("work", mem=3000)}

    def template(ns: str, name: str) -> Any:
        return templates.get(f"{ns}/{name}")

    def no_claim(ns: str, name: str) -> Any:
        return None

    pod = dra_pod("p", ["mon"])
    pod["metadata"]["namespace"] = "ns"
    assert podrequest.pod_request(pod, classes, no_claim, template) is None  # no opinion
    both = dra_pod("q", ["mon", "work"])
    both["metadata"]["namespace"] = "ns"
    weighed = podrequest.pod_request(both, classes, no_claim, template)
    assert weighed is not None
    ((only,),) = weighed.containers
    assert only.memory == 3000
