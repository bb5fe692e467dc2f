"""Fit: every reason code, device policies, several devices and containers, init containers."""

from __future__ import annotations

import pytest
from _core_helpers import MLU, NVIDIA, gpu, pod

from hami.core import fit as F
from hami.core.fit import NodeFit, NodeMiss, TypeView, fit_pod
from hami.core.requests import PodRequest, parse_pod
from hami.core.usage import DeviceState, Use, pod_usage
from hami.protocol import ContainerDevice


def dev(
    index: int,
    *,
    memory: int = 10000,
    cores: int = 100,
    count: int = 4,
    used: tuple[int, int, int] = (0, 0, 0),
    model: str = "NVIDIA-A100",
    numa: int = 0,
    healthy: bool = True,
    uuid: str | None = None,
) -> DeviceState:
    d = DeviceState(uuid or f"GPU-{index}", index, model, numa, healthy, count, memory, cores)
    d.set_use(Use(*used))
    return d


def req(*containers: dict, init: tuple = (), annotations: dict | None = None) -> PodRequest:
    r = parse_pod(pod(*containers, init=init, annotations=annotations), [NVIDIA, MLU])
    assert r is not None
    return r


def place(devices: list[DeviceState], request: PodRequest, policy: str = "spread"):
    return fit_pod({"nvidia": TypeView(devices)}, request, policy, explain=True)


def uuids(result: NodeFit | NodeMiss, container: int = 0) -> list[str]:
    assert isinstance(result, NodeFit), result
    return [d.uuid for d in result.assignment["nvidia"][container]]


@pytest.mark.parametrize(
    ("device", "request_", "annotations", "reason"),
    [
        (dev(0), gpu(), {"nvidia.com/use-gpuuuid": "GPU-9"}, F.CARD_UUID_MISMATCH),
        (dev(0), gpu(), {"nvidia.com/nouse-gpuuuid": "GPU-0"}, F.CARD_UUID_MISMATCH),
        (dev(0), gpu(), {"nvidia.com/use-gputype": "h100"}, F.CARD_TYPE_MISMATCH),
        (dev(0), gpu(), {"nvidia.com/nouse-gputype": "a100"}, F.CARD_TYPE_MISMATCH),
        (dev(0, healthy=False), gpu(), {}, F.CARD_UNHEALTHY),
        (dev(0, count=2, used=(2, 0, 0)), gpu(mem=1), {}, F.CARD_SLOTS_EXHAUSTED),
        (dev(0, used=(1, 9000, 0)), gpu(mem=2000), {}, F.CARD_INSUFFICIENT_MEMORY),
        (dev(0, used=(1, 100, 0)), gpu(pct=100), {}, F.CARD_INSUFFICIENT_MEMORY),
        (dev(0, used=(1, 100, 10)), gpu(mem=10, cores=100), {}, F.EXCLUSIVE_CONFLICT),
        (dev(0, used=(1, 100, 100)), gpu(mem=10), {}, F.CARD_CORES_EXHAUSTED),
        (dev(0, used=(1, 100, 80)), gpu(mem=10, cores=30), {}, F.CARD_INSUFFICIENT_CORE),
        # no core limiter (MLU-like): cores only mean "exclusive"
        (dev(0, cores=0, used=(1, 100, 100)), gpu(mem=10), {}, F.EXCLUSIVE_CONFLICT),
    ],
)
def test_every_device_reason(
    device: DeviceState, request_: dict, annotations: dict, reason: str
) -> None:
    result = place([device], req(request_, annotations=annotations))
    assert isinstance(result, NodeMiss)
    assert result.reason == f"1/1 {reason}"


def test_core_limit_zero_accepts_any_share_when_not_exclusive() -> None:
    result = place([dev(0, cores=0, used=(1, 100, 60))], req(gpu(mem=10, cores=60)))
    assert uuids(result) == ["GPU-0"]


def test_reasons_are_counted_and_sorted() -> None:
    devices = [
        dev(0, used=(1, 9500, 0)),
        dev(1, used=(1, 9500, 0)),
        dev(2, model="NVIDIA-T4"),
        dev(3, model="NVIDIA-T4"),
    ]
    result = place(devices, req(gpu(mem=1000), annotations={"nvidia.com/use-gputype": "a100"}))
    assert isinstance(result, NodeMiss)
    assert result.reason == "2/4 CardInsufficientMemory, 2/4 CardTypeMismatch"


def test_too_few_fitting_devices() -> None:
    devices = [dev(0), dev(1, healthy=False), dev(2)]
    result = place(devices, req(gpu(count=3, mem=10)))
    assert isinstance(result, NodeMiss)
    assert result.reason == "2/3 AllocatedCardsInsufficientRequest, 1/3 CardUnhealthy"
    result = place(devices, req(gpu(count=4, mem=10)))
    assert isinstance(result, NodeMiss)
    assert result.reason.startswith("NodeInsufficientDevice")


def test_unregistered_and_unavailable_types() -> None:
    r = req(gpu())
    assert fit_pod({}, r, "spread") == NodeMiss("node unregistered")
    miss = fit_pod({"nvidia": TypeView([dev(0)], "handshake timed out")}, r, "spread")
    assert miss == NodeMiss("handshake timed out")


def test_device_policy_spread_and_binpack() -> None:
    devices = [dev(0, used=(1, 5000, 0)), dev(1), dev(2, used=(2, 8000, 0))]
    r = req(gpu(mem=1000))
    assert uuids(place(devices, r, "spread")) == ["GPU-1"]
    assert uuids(place(devices, r, "binpack")) == ["GPU-2"]
    # ties go to the lower index
    assert uuids(place([dev(0), dev(1)], r, "spread")) == ["GPU-0"]
    assert uuids(place([dev(0), dev(1)], r, "binpack")) == ["GPU-0"]


def test_percentage_is_of_each_device() -> None:
    devices = [dev(0, memory=20000), dev(1, memory=10000)]
    result = place(devices, req(gpu(count=2, pct=50)))
    assert isinstance(result, NodeFit)
    assert result.assignment["nvidia"][0] == [
        ContainerDevice("GPU-1", "NVIDIA", 5000, 0),
        ContainerDevice("GPU-0", "NVIDIA", 10000, 0),
    ] or sorted(d.memory for d in result.assignment["nvidia"][0]) == [5000, 10000]


def test_never_the_same_device_twice_in_one_container() -> None:
    result = place([dev(0, count=10)], req(gpu(count=2, mem=10)))
    assert isinstance(result, NodeMiss)


def test_app_containers_see_each_other() -> None:
    # one device, 10000 MiB: two containers of 6000 do not fit, of 5000 do
    assert isinstance(place([dev(0)], req(gpu("a", mem=6000), gpu("b", mem=6000))), NodeMiss)
    result = place([dev(0)], req(gpu("a", mem=5000), gpu("b", mem=5000)))
    assert isinstance(result, NodeFit)
    assert result.usage == {"GPU-0": Use(2, 10000, 0)}
    # exclusive container and another on the same single device: conflict
    assert isinstance(place([dev(0)], req(gpu("a", cores=100), gpu("b", mem=10))), NodeMiss)


def test_init_containers_count_as_peak() -> None:
    # init takes the whole device, then app containers share it: fits
    r = req(gpu("a", mem=4000), gpu("b", mem=3000), init=(gpu("i", pct=100, cores=100),))
    result = place([dev(0)], r)
    assert isinstance(result, NodeFit)
    assert [len(c) for c in result.assignment["nvidia"]] == [1, 1, 1]
    assert result.usage == {"GPU-0": Use(2, 10000, 100)}


def test_pod_usage_peak_rule() -> None:
    a = ContainerDevice("GPU-a", "NVIDIA", 3000, 30)
    b = ContainerDevice("GPU-a", "NVIDIA", 2000, 10)
    big = ContainerDevice("GPU-a", "NVIDIA", 9000, 5)
    other = ContainerDevice("GPU-b", "NVIDIA", 100, 0)
    assert pod_usage([[big], [a], [b]], 1) == {"GPU-a": Use(2, 9000, 40)}
    assert pod_usage([[big, other], [a]], 1) == {"GPU-a": Use(1, 9000, 30), "GPU-b": Use(1, 100, 0)}
    assert pod_usage([[a], [b]], 0) == {"GPU-a": Use(2, 5000, 40)}
    assert pod_usage([[], []], 0) == {}


def test_numa_bind() -> None:
    devices = [dev(0, numa=0), dev(1, numa=1), dev(2, numa=1, used=(3, 9000, 0)), dev(3, numa=0)]
    annotations = {"nvidia.com/numa-bind": "true"}
    result = place(devices, req(gpu(count=2, mem=100), annotations=annotations))
    assert sorted(uuids(result)) == ["GPU-0", "GPU-3"]
    devices[3] = dev(3, numa=0, healthy=False)
    result = place(devices, req(gpu(count=2, mem=2000), annotations=annotations))
    assert isinstance(result, NodeMiss)
    assert result.reason == "2/4 NumaNotFit, 1/4 CardInsufficientMemory, 1/4 CardUnhealthy"
    # without numa-bind the same request fits across NUMA nodes
    assert sorted(uuids(place(devices, req(gpu(count=2, mem=2000))))) == ["GPU-0", "GPU-1"]


def test_vendor_word_and_two_types() -> None:
    c = {
        "name": "c",
        "resources": {
            "limits": {
                "nvidia.com/gpu": "1",
                "cambricon.com/vmlu": "1",
                "cambricon.com/mlu.smlu.vmemory": "2",
            }
        },
    }
    r = req(c)
    mlu = [dev(0, uuid="MLU-0", cores=0, model="MLU-MLU370-X4")]
    result = fit_pod({"nvidia": TypeView([dev(0)]), "mlu": TypeView(mlu)}, r, "spread")
    assert isinstance(result, NodeFit)
    assert result.assignment["mlu"] == [[ContainerDevice("MLU-0", "MLU", 512, 100)]]
    assert result.assignment["nvidia"] == [[ContainerDevice("GPU-0", "NVIDIA", 10000, 0)]]
