"""Request parsing: protocol.md section 3 defaults, backend units, selectors, errors."""

from __future__ import annotations

from typing import Any

import pytest
from _core_helpers import MLU, NVIDIA, gpu, pod

from hami.core.requests import (
    DeviceRequest,
    RequestError,
    Selectors,
    parse_pod,
    parse_quantity,
)


def only(p: dict[str, Any]) -> DeviceRequest:
    request = parse_pod(p, [NVIDIA, MLU])
    assert request is not None
    (container,) = request.containers
    (item,) = container
    return item


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        # count only: whole memory, no core share (NVIDIA)
        ({"count": 1}, DeviceRequest("nvidia", "NVIDIA", 1, 0, 100, 0)),
        ({"count": 2, "mem": 3000}, DeviceRequest("nvidia", "NVIDIA", 2, 3000, None, 0)),
        ({"count": 1, "pct": 30, "cores": 50}, DeviceRequest("nvidia", "NVIDIA", 1, 0, 30, 50)),
        # memory wins over percentage
        ({"count": 1, "mem": 1000, "pct": 30}, DeviceRequest("nvidia", "NVIDIA", 1, 1000, None, 0)),
        # memory without count: one device
        ({"count": None, "mem": 1000}, DeviceRequest("nvidia", "NVIDIA", 1, 1000, None, 0)),
        ({"count": 1, "cores": 100}, DeviceRequest("nvidia", "NVIDIA", 1, 0, 100, 100)),
    ],
)
def test_nvidia_defaults(limits: dict[str, Any], expected: DeviceRequest) -> None:
    assert only(pod(gpu(**limits))) == expected


def test_mlu_units_and_exclusive_default() -> None:
    p = pod(
        {
            "name": "c",
            "resources": {
                "limits": {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "4"}
            },
        }
    )
    assert only(p) == DeviceRequest("mlu", "MLU", 1, 1024, None, 100)
    p = pod(
        {
            "name": "c",
            "resources": {
                "limits": {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vcore": "25"}
            },
        }
    )
    assert only(p) == DeviceRequest("mlu", "MLU", 1, 0, 100, 25)


def test_no_managed_resource_is_none() -> None:
    assert parse_pod(pod({"name": "c", "resources": {"limits": {"cpu": "1"}}}), [NVIDIA]) is None
    assert parse_pod(pod(gpu(count=0)), [NVIDIA]) is None
    assert parse_pod({"metadata": {}, "spec": {}}, [NVIDIA]) is None


def test_requests_fall_back_when_no_limits() -> None:
    p = pod(
        {"name": "c", "resources": {"requests": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10}}}
    )
    assert only(p).memory == 10


def test_init_and_app_containers_keep_positions() -> None:
    p = pod(gpu("a", mem=10), {"name": "b"}, init=({"name": "i"}, gpu("j", mem=20)))
    request = parse_pod(p, [NVIDIA])
    assert request is not None
    assert request.init_count == 2
    assert [len(c) for c in request.containers] == [0, 1, 1, 0]
    assert request.containers[1][0].memory == 20
    assert request.type_words == ["nvidia"]


def test_two_types_in_one_container() -> None:
    c = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "cambricon.com/vmlu": "2"}}}
    request = parse_pod(pod(c), [NVIDIA, MLU])
    assert request is not None
    assert [r.type_word for r in request.containers[0]] == ["nvidia", "mlu"]


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [
        ({"count": 1, "pct": 0}, "between 1 and 100"),
        ({"count": 1, "pct": 101}, "between 1 and 100"),
        ({"count": 1, "cores": 101}, "nvidia.com/gpucores must be between 0 and 100"),
        ({"count": 1, "mem": "1.5"}, "not a whole number"),
        ({"count": 1, "mem": "lots"}, "not a whole number"),
        ({"count": 1, "mem": -5}, "must be > 0"),
        ({"count": -1}, "must be >= 1"),
    ],
)
def test_invalid_requests_say_what_to_fix(limits: dict[str, Any], fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_pod(pod(gpu(**limits), name="bad"), [NVIDIA])
    assert fragment in str(info.value)
    assert "default/bad" in str(info.value)


def test_selectors_and_policies() -> None:
    annotations = {
        "nvidia.com/use-gputype": "A100, v100",
        "nvidia.com/nouse-gputype": "T4",
        "nvidia.com/use-gpuuuid": "GPU-a,GPU-b",
        "nvidia.com/nouse-gpuuuid": "GPU-c",
        "nvidia.com/numa-bind": "true",
        "hami.io/node-scheduler-policy": "spread",
        "hami.io/gpu-scheduler-policy": "Binpack",
    }
    request = parse_pod(pod(gpu(), annotations=annotations), [NVIDIA])
    assert request is not None
    assert request.selectors_for("nvidia") == Selectors(
        ("a100", "v100"), ("t4",), frozenset({"GPU-a", "GPU-b"}), frozenset({"GPU-c"}), True
    )
    assert (request.node_policy, request.device_policy) == ("spread", "binpack")
    selectors = request.selectors_for("nvidia")
    assert selectors.type_ok("NVIDIA-Tesla V100-PCIE-32GB")
    assert not selectors.type_ok("NVIDIA-Tesla T4")
    assert not selectors.uuid_ok("GPU-c") and selectors.uuid_ok("GPU-a")
    assert not selectors.uuid_ok("GPU-z")


def test_bad_policy_annotation_falls_back_with_a_warning() -> None:
    # issue 10 item 7: an unknown value never rejects a pod (Go HAMi ignores it too)
    request = parse_pod(pod(gpu(), annotations={"hami.io/gpu-scheduler-policy": "pack"}), [NVIDIA])
    assert request is not None and request.device_policy is None
    assert len(request.warnings) == 1 and "'pack'" in request.warnings[0]


def test_mlu_selector_keys() -> None:
    assert MLU.annotation("use-type") == "cambricon.com/use-mlutype"
    assert NVIDIA.annotation("nouse-uuid") == "nvidia.com/nouse-gpuuuid"
    assert NVIDIA.annotation("numa-bind") == "nvidia.com/numa-bind"


@pytest.mark.parametrize(
    ("text", "value"),
    [("3000", 3000), (7, 7), ("2k", 2000), ("1Ki", 1024), ("2000m", 2), ("1e3", None)],
)
def test_quantities(text: Any, value: int | None) -> None:
    if value is None:
        with pytest.raises(ValueError):
            parse_quantity(text)
    else:
        assert parse_quantity(text) == value
