"""Pods written for Go HAMi (issue 10 item 7): ``hami.io/gpu-scheduler-policy`` as a comma
list (binpack, spread, numa, mutex, topology-aware), ``hami.io/device-scoring-weights``,
and ``hami.io/node-nvidia-score`` read from either writer. Pure: fit, requests, cluster."""

from __future__ import annotations

from typing import Any

import pytest
from _core_helpers import MLU, NVIDIA, gpu, pod
from hypothesis import given, settings
from hypothesis import strategies as st

from hami import config
from hami.core import fit as F
from hami.core import topology
from hami.core.fit import NodeFit, NodeMiss, TypeView, fit_pod
from hami.core.requests import (
    DEVICE_POLICY_WORDS,
    DevicePolicy,
    PodRequest,
    Weights,
    device_policy_of,
    parse_pod,
    parse_weights,
)
from hami.core.usage import DeviceState, Use
from hami.scheduler.webhook import review

POLICY = "hami.io/gpu-scheduler-policy"
WEIGHTS = "hami.io/device-scoring-weights"


def dev(
    index: int,
    *,
    memory: int = 10000,
    used: tuple[int, int, int] = (0, 0, 0),
    numa: int = 0,
    count: int = 4,
) -> DeviceState:
    d = DeviceState(f"GPU-{index}", index, "NVIDIA-A100", numa, True, count, memory, 100)
    d.set_use(Use(*used))
    return d


def req(*containers: dict[str, Any], annotations: dict[str, str] | None = None) -> PodRequest:
    r = parse_pod(pod(*containers, annotations=annotations), [NVIDIA, MLU])
    assert r is not None
    return r


def place(
    devices: list[DeviceState],
    request: PodRequest,
    policy: str = "spread",
    scores: dict[str, dict[str, int]] | None = None,
) -> NodeFit | NodeMiss:
    view = TypeView(devices, None, scores or {})
    return fit_pod({"nvidia": view}, request, request.device_policy or policy, explain=True)


def uuids(result: NodeFit | NodeMiss, container: int = 0) -> list[str]:
    assert isinstance(result, NodeFit), result
    return [d.uuid for d in result.assignment["nvidia"][container]]


# --------------------------------------------------------------------------- parsing


def test_the_policy_is_a_comma_list_of_known_words() -> None:
    r = req(gpu(), annotations={POLICY: " Binpack , numa,mutex,topology-aware,binpack"})
    assert r.device_policy == "binpack,numa,mutex,topology-aware"
    assert r.warnings == ()
    assert device_policy_of(r.device_policy) == DevicePolicy(("binpack", "numa"), True, True)
    # filters only: no sort key means spread, as in Go HAMi
    assert device_policy_of("mutex,topology-aware") == DevicePolicy(("spread",), True, True)
    assert device_policy_of("numa") == DevicePolicy(("numa",))


@pytest.mark.parametrize(
    ("value", "policy"),
    [("pack", None), ("binpack,best-fit", "binpack"), ("numa, ,  ", "numa")],
)
def test_an_unknown_policy_word_is_a_warning_never_a_rejection(
    value: str, policy: str | None
) -> None:
    r = req(gpu(), annotations={POLICY: value})
    assert r.device_policy == policy
    if policy == "numa":
        assert r.warnings == ()
    else:
        (warning,) = r.warnings
        assert POLICY in warning and "is used" in warning


def test_an_unknown_node_policy_is_a_warning() -> None:
    r = req(gpu(), annotations={"hami.io/node-scheduler-policy": "fastest"})
    assert r.node_policy is None
    assert "hami.io/node-scheduler-policy" in r.warnings[0]


def test_weights_are_read_as_go_hami_reads_them() -> None:
    assert parse_weights("slot=1,core=1,memory=3") == Weights(1, 1, 3)
    assert parse_weights(" memory = 2 , slot=0,core=+1") == Weights(0, 1, 2)
    for bad, why in [
        ("slot=1,core=1", "expected slot, core and memory"),
        ("slot=1,core=1,memory", "key=value"),
        ("slot=1,slot=1,memory=1", "duplicate"),
        ("slot=1,core=x,memory=1", "must be an integer"),
        ("slot=1,core=1_0,memory=1", "must be an integer"),
        ("slot=-1,core=1,memory=1", "must not be negative"),
        ("slot=1,core=1,disk=1", "unknown weight"),
        ("slot=0,core=0,memory=0", "at least one"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_weights(bad)
    r = req(gpu(), annotations={WEIGHTS: "slot=1"})
    assert r.weights == Weights() and WEIGHTS in r.warnings[0]
    assert req(gpu(), annotations={WEIGHTS: "slot=0,core=0,memory=1"}).weights == Weights(0, 0, 1)


# --------------------------------------------------------------------------- mutex


def test_mutex_takes_only_devices_nobody_uses() -> None:
    devices = [dev(0, used=(1, 100, 0)), dev(1), dev(2, used=(1, 100, 0))]
    plain = place(devices, req(gpu(mem=1000), annotations={POLICY: "binpack"}))
    assert uuids(plain) == ["GPU-0"]  # binpack alone: the used one
    mutex = place(devices, req(gpu(mem=1000), annotations={POLICY: "binpack,mutex"}))
    assert uuids(mutex) == ["GPU-1"]
    # two devices asked, one idle: no fit, the busy ones say why
    miss = place(devices, req(gpu(count=2, mem=1000), annotations={POLICY: "mutex"}))
    assert isinstance(miss, NodeMiss)
    assert miss.counts[F.EXCLUSIVE_CONFLICT] == 2


def test_mutex_counts_the_pods_own_earlier_containers() -> None:
    r = req(gpu("a", mem=1000), gpu("b", mem=1000), annotations={POLICY: "mutex"})
    result = place([dev(0), dev(1)], r)
    assert uuids(result, 0) != uuids(result, 1)
    assert isinstance(place([dev(0)], r), NodeMiss)


# --------------------------------------------------------------------------- numa


def test_numa_after_binpack_breaks_score_ties_by_numa_node() -> None:
    # four equal devices; indexes interleave NUMA nodes
    devices = [dev(0, numa=1), dev(1, numa=0), dev(2, numa=1), dev(3, numa=0)]
    r = req(gpu(count=2, mem=1000), annotations={POLICY: "binpack"})
    assert uuids(place(devices, r)) == ["GPU-0", "GPU-1"]  # by index: across NUMA nodes
    r = req(gpu(count=2, mem=1000), annotations={POLICY: "binpack,numa"})
    assert uuids(place(devices, r)) == ["GPU-1", "GPU-3"]  # one NUMA node


def test_numa_first_groups_devices_before_the_score() -> None:
    devices = [dev(0, numa=1), dev(1, numa=0, used=(1, 5000, 0)), dev(2, numa=0, used=(1, 100, 0))]
    spread_first = req(gpu(mem=1000), annotations={POLICY: "spread,numa"})
    assert uuids(place(devices, spread_first)) == ["GPU-0"]  # the least used
    numa_first = req(gpu(mem=1000), annotations={POLICY: "numa,spread"})
    assert uuids(place(devices, numa_first)) == ["GPU-2"]  # NUMA 0, then the least used there


# --------------------------------------------------------------------------- weights


def test_weights_change_which_device_spread_prefers() -> None:
    # GPU-0: many slots used, little memory; GPU-1: one slot, much memory
    devices = [dev(0, used=(3, 1000, 0), count=10), dev(1, used=(1, 8000, 0), count=10)]
    equal = req(gpu(mem=1000))
    assert uuids(place(devices, equal)) == ["GPU-0"]  # (0.4+0.2)/3 < (0.2+0.9)/3
    by_slots = req(gpu(mem=1000), annotations={WEIGHTS: "slot=10,core=0,memory=1"})
    assert uuids(place(devices, by_slots)) == ["GPU-1"]
    # the node score keeps the equal weights (Go HAMi weighs devices only)
    a = place(devices, equal)
    b = place(devices, req(gpu(mem=1000), annotations={WEIGHTS: "slot=1,core=1,memory=1"}))
    assert isinstance(a, NodeFit) and isinstance(b, NodeFit)
    assert a.utilisation_delta == b.utilisation_delta


# --------------------------------------------------------------------------- topology-aware

# Two NVLink pairs (0-1, 2-3) on two NUMA nodes; PCIe across (HAMi's scores).
PAIRS = {(0, 1): 210, (2, 3): 220, (0, 2): 10, (0, 3): 10, (1, 2): 10, (1, 3): 10}


def scores(pairs: dict[tuple[int, int], int] = PAIRS) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (a, b), value in pairs.items():
        out.setdefault(f"GPU-{a}", {})[f"GPU-{b}"] = value
        out.setdefault(f"GPU-{b}", {})[f"GPU-{a}"] = value
    return out


def test_topology_aware_takes_the_best_connected_set() -> None:
    devices = [dev(i) for i in range(4)]
    plain = req(gpu(count=2, mem=1000), annotations={POLICY: "spread"})
    assert uuids(place(devices, plain, scores=scores())) == ["GPU-0", "GPU-1"]
    # spread would take 0 and 2 (the least used); the NVLink pair 2-3 wins on topology
    devices[1].set_use(Use(1, 100, 0))
    assert uuids(place(devices, plain, scores=scores())) == ["GPU-0", "GPU-2"]
    topo = req(gpu(count=2, mem=1000), annotations={POLICY: "topology-aware"})
    assert uuids(place(devices, topo, scores=scores())) == ["GPU-2", "GPU-3"]
    three = req(gpu(count=3, mem=1000), annotations={POLICY: "spread,topology-aware"})
    # {0,2,3} = 10+10+220, {1,2,3} = 240, {0,1,2} = 230: ties keep the policy's order
    assert uuids(place(devices, three, scores=scores())) == ["GPU-0", "GPU-2", "GPU-3"]


def test_topology_aware_one_device_keeps_good_pairs_free() -> None:
    devices = [dev(i) for i in range(3)]
    pairs = {(0, 1): 200, (0, 2): 10, (1, 2): 10}
    one = req(gpu(mem=1000), annotations={POLICY: "topology-aware"})
    assert uuids(place(devices, one, scores=scores(pairs))) == ["GPU-2"]  # worst connected


def test_topology_aware_without_scores_is_the_policy_order() -> None:
    devices = [dev(0, used=(1, 100, 0)), dev(1), dev(2)]
    topo = req(gpu(count=2, mem=1000), annotations={POLICY: "topology-aware"})
    assert uuids(place(devices, topo)) == ["GPU-1", "GPU-2"]


def test_topology_aware_with_numa_bind_stays_on_one_numa_node() -> None:
    devices = [dev(0, numa=0), dev(1, numa=0), dev(2, numa=1), dev(3, numa=1), dev(4, numa=1)]
    pairs = {(0, 2): 900, (3, 4): 300, (2, 3): 100}
    topo = req(
        gpu(count=2, mem=1000),
        annotations={POLICY: "topology-aware", "nvidia.com/numa-bind": "true"},
    )
    assert uuids(place(devices, topo, scores=scores(pairs))) == ["GPU-3", "GPU-4"]


def test_topology_aware_is_bounded_on_huge_nodes() -> None:
    devices = [dev(i) for i in range(40)]  # C(40, 8) sets: too many to compare one by one
    pairs = {(a, b): 100 if a // 8 == b // 8 else 1 for a in range(40) for b in range(a + 1, 40)}
    topo = req(gpu(count=8, mem=1000), annotations={POLICY: "topology-aware"})
    chosen = uuids(place(devices, topo, scores=scores(pairs)))
    assert chosen == [f"GPU-{i}" for i in range(8)]  # greedy from the best-ranked device


# --------------------------------------------------------------------------- the score value


GO_VALUE = (
    '[{"uuid":"GPU-0","score":{"GPU-1":1210,"GPU-2":10}},'
    '{"uuid":"GPU-1","score":{"GPU-0":1210,"GPU-2":10}},'
    '{"uuid":"GPU-2","score":{"GPU-0":10,"GPU-1":10}}]'
)


def test_the_score_value_reads_as_go_writes_it() -> None:
    assert topology.score_key("nvidia") == "hami.io/node-nvidia-score"
    parsed = topology.parse_pair_scores(GO_VALUE)
    assert parsed["GPU-0"] == {"GPU-1": 1210, "GPU-2": 10}
    pairs = {("GPU-0", "GPU-1"): 1210, ("GPU-1", "GPU-0"): 1210}
    for a in ("GPU-0", "GPU-1"):
        pairs[(a, "GPU-2")] = pairs[("GPU-2", a)] = 10
    assert topology.encode_pair_scores(["GPU-0", "GPU-1", "GPU-2"], pairs) == GO_VALUE
    assert topology.parse_pair_scores('[{"uuid":"GPU-0"}, null]') == {"GPU-0": {}}
    assert topology.parse_pair_scores("null") == {}


@pytest.mark.parametrize(
    "bad",
    ["{", '{"uuid":"a"}', '[{"uuid":1}]', '[{"uuid":"a","score":[]}]', '[{"score":{"b":1.5}}]'],
)
def test_an_unreadable_score_value_is_no_scores(bad: str) -> None:
    with pytest.raises(ValueError):
        topology.parse_pair_scores(bad)
    assert topology.read_pair_scores(bad)[0] == {}


def test_the_scheduler_default_may_be_a_comma_list() -> None:

    raw = {"scheduler": {"device_policy": "binpack,numa"}}
    assert config.from_mapping(raw, env={}).scheduler.device_policy == "binpack,numa"
    with pytest.raises(config.ConfigError, match=r"scheduler\.device_policy.*'binpack,best'"):
        config.from_mapping({"scheduler": {"device_policy": "binpack,best"}}, env={})


def test_the_webhook_admits_unknown_policies_with_a_warning() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "annotations": {POLICY: "binpack,fastest", WEIGHTS: "slot=1"},
        },
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }
    body = {"request": {"uid": "u", "kind": {"kind": "Pod"}, "object": pod}}
    response = review(body, [NVIDIA], "hami-scheduler")["response"]
    assert response["allowed"] is True
    warnings = response["warnings"]
    assert len(warnings) == 2
    assert all(w.startswith("pod ns/p: annotation hami.io/") for w in warnings)
    assert "'fastest'" in warnings[0] and WEIGHTS in warnings[1]


def test_numa_bind_takes_exactly_the_count_from_a_larger_numa_node() -> None:
    devices = [dev(0, numa=0), dev(1, numa=0), dev(2, numa=0), dev(3, numa=1)]
    for policy in ("spread", "topology-aware"):
        r = req(
            gpu(count=2, mem=1000), annotations={POLICY: policy, "nvidia.com/numa-bind": "true"}
        )
        assert uuids(place(devices, r)) == ["GPU-0", "GPU-1"], policy


@settings(max_examples=300, deadline=None)
@given(
    layout=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 9000)),
        min_size=1,
        max_size=9,
    ),
    words=st.lists(st.sampled_from(DEVICE_POLICY_WORDS), max_size=4),
    count=st.integers(1, 4),
    numa_bind=st.booleans(),
    score_seed=st.integers(0, 1000),
)
def test_every_policy_gives_exactly_the_count_of_distinct_fitting_devices(
    layout: list[tuple[int, int, int]],
    words: list[str],
    count: int,
    numa_bind: bool,
    score_seed: int,
) -> None:
    devices = [
        dev(i, numa=numa, used=(used, memory, 0) if used else (0, 0, 0))
        for i, (numa, used, memory) in enumerate(layout)
    ]
    uuids_ = [d.uuid for d in devices]
    pairs = {
        (a, b): (score_seed * (i + 1) * (j + 3)) % 997
        for i, a in enumerate(uuids_)
        for j, b in enumerate(uuids_)
        if a != b
    }
    scores_: dict[str, dict[str, int]] = {}
    for (a, b), value in pairs.items():
        scores_.setdefault(a, {})[b] = value
    annotations = {POLICY: ",".join(words) or "spread"}
    if numa_bind:
        annotations["nvidia.com/numa-bind"] = "true"
    r = req(gpu(count=count, mem=500), annotations=annotations)
    result = place(devices, r, scores=scores_)
    if isinstance(result, NodeMiss):
        return
    chosen = result.assignment["nvidia"][0]
    assert len(chosen) == count
    assert len({d.uuid for d in chosen}) == count
    by_uuid = {d.uuid: d for d in devices}
    if "mutex" in words:
        assert all(by_uuid[d.uuid].used == 0 for d in chosen)
    if numa_bind:
        assert len({by_uuid[d.uuid].numa for d in chosen}) == 1
