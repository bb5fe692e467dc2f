"""Cambricon uuid selectors: Go HAMi 2.10's ``cambricon.com/use-gpuuuid`` keys, with the
``use-mluuuid`` keys this project documented first still read (issue 24)."""

from __future__ import annotations

from typing import Any

import pytest
from _core_helpers import NVIDIA, gpu, pod

from hami.backends.cambricon import CambriconBackend
from hami.core.requests import DeviceKind, RequestError, parse_pod

MLU = DeviceKind.from_backend(CambriconBackend())


def mlu_pod(annotations: dict[str, str]) -> dict[str, Any]:
    container = {"name": "c", "resources": {"limits": {"cambricon.com/vmlu": "1"}}}
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": annotations},
        "spec": {"containers": [container]},
    }


def uuid_ok(annotations: dict[str, str], uuid: str) -> bool:
    request = parse_pod(mlu_pod(annotations), [MLU])
    assert request is not None
    return request.selectors_for("mlu").uuid_ok(uuid)


def test_go_keys_are_the_kinds_uuid_selectors() -> None:
    assert MLU.annotation("use-uuid") == "cambricon.com/use-gpuuuid"
    assert MLU.annotation("nouse-uuid") == "cambricon.com/nouse-gpuuuid"
    assert MLU.annotation("use-type") == "cambricon.com/use-mlutype"  # unchanged


@pytest.mark.parametrize("verb", ["use", "nouse"])
@pytest.mark.parametrize("word", ["gpu", "mlu"])
def test_either_key_selects(verb: str, word: str) -> None:
    annotations = {f"cambricon.com/{verb}-{word}uuid": "MLU-a, MLU-b"}
    used = verb == "use"
    assert uuid_ok(annotations, "MLU-a") is used
    assert uuid_ok(annotations, "MLU-b") is used
    assert uuid_ok(annotations, "MLU-c") is not used


def test_both_keys_with_the_same_devices_are_accepted() -> None:
    annotations = {
        "cambricon.com/use-gpuuuid": "MLU-a,MLU-b",
        "cambricon.com/use-mluuuid": "MLU-b, MLU-a",
    }
    assert uuid_ok(annotations, "MLU-a") and not uuid_ok(annotations, "MLU-c")


@pytest.mark.parametrize("verb", ["use", "nouse"])
def test_both_keys_disagreeing_refuse_the_pod(verb: str) -> None:
    annotations = {
        f"cambricon.com/{verb}-gpuuuid": "MLU-a",
        f"cambricon.com/{verb}-mluuuid": "MLU-b",
    }
    with pytest.raises(RequestError) as caught:
        parse_pod(mlu_pod(annotations), [MLU])
    message = str(caught.value)
    assert "pod ns/p" in message
    assert f"cambricon.com/{verb}-gpuuuid='MLU-a'" in message
    assert f"cambricon.com/{verb}-mluuuid='MLU-b'" in message
    assert f"set only cambricon.com/{verb}-gpuuuid" in message


def test_an_empty_go_key_leaves_the_old_key_in_force() -> None:
    annotations = {"cambricon.com/use-gpuuuid": " ", "cambricon.com/use-mluuuid": "MLU-a"}
    assert uuid_ok(annotations, "MLU-a") and not uuid_ok(annotations, "MLU-b")


def test_other_kinds_have_no_aliases() -> None:
    annotations = {"nvidia.com/use-gpuuuid": "GPU-a", "nvidia.com/use-mluuuid": "GPU-b"}
    request = parse_pod(pod(gpu(), annotations=annotations), [NVIDIA])
    assert request is not None and request.selectors_for("nvidia").uuid_ok("GPU-a")
    assert not request.selectors_for("nvidia").uuid_ok("GPU-b")
