"""Property tests of the scheduler core: garbage never crashes it, and the incremental
usage always equals a rebuild from scratch and never exceeds a device."""

from __future__ import annotations

from typing import Any

from _core_helpers import MLU, NOW, NVIDIA, gpu, node, pod, register
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core.cluster import Cluster
from hami.core.requests import RequestError, parse_pod
from hami.protocol import encode_pod_devices

text = st.text(alphabet=st.sampled_from(list('GPU-,:;0123456789abtrue[]{}" .%')), max_size=60)
values = st.one_of(text, st.integers(-5, 10**12), st.booleans(), st.none(), st.floats())


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    limits=st.dictionaries(
        st.sampled_from(
            [
                "nvidia.com/gpu",
                "nvidia.com/gpumem",
                "nvidia.com/gpumem-percentage",
                "nvidia.com/gpucores",
                "cambricon.com/vmlu",
                "cambricon.com/mlu.smlu.vmemory",
                "cambricon.com/mlu.smlu.vcore",
            ]
        ),
        values,
        max_size=5,
    ),
    annotations=st.dictionaries(
        st.sampled_from(
            ["nvidia.com/use-gputype", "nvidia.com/numa-bind", "hami.io/node-scheduler-policy"]
        ),
        text,
        max_size=3,
    ),
)
def test_any_limits_parse_or_raise_request_error(
    limits: dict[str, Any], annotations: dict[str, str]
) -> None:
    p = pod({"name": "c", "resources": {"limits": limits}}, annotations=annotations)
    try:
        request = parse_pod(p, [NVIDIA, MLU])
    except RequestError as exc:
        assert "default/p" in str(exc) or "annotation" in str(exc)
        return
    if request is not None:
        for item in request.containers[0]:
            assert item.count >= 1 and 0 <= item.cores <= 100
            assert item.memory > 0 or item.memory_percentage is not None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(register_value=text, shake=text, allocated=text, bind_phase=text)
def test_garbage_annotations_never_crash(
    register_value: str, shake: str, allocated: str, bind_phase: str
) -> None:
    c = Cluster([NVIDIA])
    c.upsert_node(node("n", register_value, shake=shake), NOW)
    c.upsert_pod(
        pod(
            gpu(),
            annotations={
                "hami.io/vgpu-node": "n",
                "hami.io/vgpu-devices-allocated": allocated,
                "hami.io/bind-phase": bind_phase,
            },
        )
    )
    c.refresh(NOW)
    request = parse_pod(pod(gpu(mem=10)), [NVIDIA])
    assert request is not None
    decision = c.decide(request)
    assert decision.node in (None, "n")
    c.delete_pod("default/p")
    c.delete_node("n")
    assert c.usage_snapshot() == {}


shapes = st.tuples(st.integers(1, 2), st.integers(1, 6000), st.sampled_from([0, 0, 30, 100]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.booleans(), shapes), min_size=1, max_size=40))
def test_reservations_match_a_rebuild_and_never_overcommit(steps: list[Any]) -> None:
    c = Cluster([NVIDIA])
    for n in range(3):
        c.upsert_node(
            node(f"n{n}", register([f"GPU-{n}-{d}" for d in range(2)], memory=10000, count=3)), NOW
        )
    pods: dict[str, dict[str, Any]] = {}
    for i, (remove, (count, mem, cores)) in enumerate(steps):
        if remove and pods:
            key = sorted(pods)[i % len(pods)]
            del pods[key]
            c.delete_pod(key)
            continue
        request = parse_pod(pod(gpu(count=count, mem=mem, cores=cores)), [NVIDIA])
        assert request is not None
        decision = c.decide(request)
        if decision.node is None or decision.fit is None:
            assert decision.failed and all(decision.failed.values())
            continue
        key = f"default/p{i}"
        c.reserve(key, f"uid-{i}", decision.node, decision.fit)
        pods[key] = pod(
            gpu(),
            name=f"p{i}",
            annotations={
                "hami.io/vgpu-node": decision.node,
                "hami.io/vgpu-devices-allocated": encode_pod_devices(
                    decision.fit.assignment["nvidia"]
                ),
            },
        )
    for state in c.nodes.values():
        for device in state.devices.values():
            assert device.used <= device.count
            assert device.used_memory <= device.total_memory
            assert device.used_cores <= device.total_cores
    fresh = Cluster([NVIDIA])
    for p in pods.values():
        fresh.upsert_pod(p)
    for n in range(3):
        fresh.upsert_node(
            node(f"n{n}", register([f"GPU-{n}-{d}" for d in range(2)], memory=10000, count=3)), NOW
        )
    assert fresh.usage_snapshot() == c.usage_snapshot()
