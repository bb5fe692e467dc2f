"""ResourceSlice and DeviceClass bodies from a backend's devices (hami.dra.slices): pure."""

from __future__ import annotations

import copy

from hami.backends.base import BackendSettings, Device
from hami.backends.fake import FakeBackend
from hami.dra import names, slices


def backend(**settings: object) -> FakeBackend:
    return FakeBackend(BackendSettings(**settings))  # type: ignore[arg-type]


DEVICES = [
    Device("GPU-a-0", 0, "NVIDIA A100", 40960, numa=0),
    Device("GPU-a-1", 1, "NVIDIA A100", 40960, numa=1),
]


def test_driver_and_names() -> None:
    assert names.driver_name("nvidia") == "nvidia.hami.io"
    assert names.driver_name("MLU") == "mlu.hami.io"
    assert names.cdi_device_id("nvidia.hami.io", "u-1") == "nvidia.hami.io/claim=u-1"
    assert names.slice_name("node-a", "nvidia") == "node-a-nvidia-hami-io"


def test_one_pool_per_node_one_device_per_physical_device() -> None:
    body = slices.resource_slice("node-a", backend(split_count=4), DEVICES)
    spec = body["spec"]
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert spec["driver"] == "nvidia.hami.io"
    assert spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 0, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["nvidia-0", "nvidia-1"]
    dev = spec["devices"][1]
    assert dev["allowMultipleAllocations"] is True
    assert dev["attributes"]["uuid"] == {"string": "GPU-a-1"}
    assert dev["attributes"]["model"] == {"string": "NVIDIA A100"}
    assert dev["attributes"]["vendor"] == {"string": "NVIDIA"}
    assert dev["attributes"]["numa"] == {"int": 1}
    assert dev["attributes"]["index"] == {"int": 1}
    assert dev["attributes"]["healthy"] == {"bool": True}
    capacity = dev["capacity"]
    assert capacity["memory"]["value"] == "40960Mi"
    # a request naming no memory takes the whole device (HAMi: count without memory = 100 %)
    assert capacity["memory"]["requestPolicy"]["default"] == "40960Mi"
    assert capacity["cores"]["value"] == "100"
    assert capacity["cores"]["requestPolicy"]["default"] == "0"  # NVIDIA: no core limit
    assert capacity["cores"]["requestPolicy"]["validRange"]["max"] == "100"
    assert capacity["slots"]["value"] == "4"  # the split count
    assert capacity["slots"]["requestPolicy"] == {"default": "1", "validValues": ["1"]}


def test_memory_scaling_applies_and_unhealthy_devices_are_tainted() -> None:
    sick = Device("GPU-a-1", 1, "NVIDIA A100", 40960, healthy=False, unhealthy_reason="xid-48")
    spec = slices.slice_spec("node-a", backend(memory_scaling=1.5), [DEVICES[0], sick], 0)
    assert [d["name"] for d in spec["devices"]] == ["nvidia-0", "nvidia-1"]
    assert spec["devices"][0]["capacity"]["memory"]["value"] == f"{int(40960 * 1.5)}Mi"
    assert "taints" not in spec["devices"][0]
    assert spec["devices"][1]["attributes"]["healthy"] == {"bool": False}
    assert spec["devices"][1]["taints"] == [
        {"key": "hami.io/unhealthy", "value": "xid-48", "effect": "NoSchedule"}
    ]
    # an API server that drops taints: the unhealthy device leaves the slice instead
    plain = slices.slice_spec("node-a", backend(), [DEVICES[0], sick], 0, with_taints=False)
    assert [d["name"] for d in plain["devices"]] == ["nvidia-0"]


def test_device_class_selects_by_driver() -> None:
    body = slices.device_class(backend())
    assert body["metadata"]["name"] == "nvidia.hami.io"
    assert body["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "nvidia.hami.io"'}}
    ]
    assert "extendedResourceName" not in body["spec"]
    mapped = slices.device_class(backend(), "nvidia.com/gpu")
    assert mapped["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_next_slice_writes_only_on_change_and_bumps_generation() -> None:
    b = backend()
    first = slices.next_slice("node-a", b, DEVICES, None)
    assert first is not None and first["spec"]["pool"]["generation"] == 0
    stored = copy.deepcopy(first)
    stored["metadata"]["resourceVersion"] = "17"
    # the API server writes quantities back canonically: still no change
    stored["spec"]["devices"][0]["capacity"]["memory"]["value"] = "40Gi"
    stored["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["default"] = "40Gi"
    assert slices.next_slice("node-a", b, DEVICES, stored) is None
    sick = [DEVICES[0], Device("GPU-a-1", 1, "NVIDIA A100", 40960, healthy=False)]
    changed = slices.next_slice("node-a", b, sick, stored)
    assert changed is not None
    assert changed["spec"]["pool"]["generation"] == 1
    assert changed["metadata"]["resourceVersion"] == "17"
    assert [d["name"] for d in changed["spec"]["devices"]] == ["nvidia-0", "nvidia-1"]
    assert changed["spec"]["devices"][1]["taints"][0]["key"] == "hami.io/unhealthy"
    gone = slices.next_slice("node-a", b, sick, stored, with_taints=False)
    assert gone is not None
    assert [d["name"] for d in gone["spec"]["devices"]] == ["nvidia-0"]
