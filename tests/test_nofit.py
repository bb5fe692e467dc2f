"""The cheap no-fit answer (hami.core.nofit): per-node reasons from the summaries agree with
the detailed path, and answers are reused only while the cluster has not changed."""

from __future__ import annotations

from typing import Any

from _core_helpers import NOW, NVIDIA, gpu, node, pod, register
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core import nofit
from hami.core.cluster import Cluster, _needs
from hami.core.fit import (
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
    EXCLUSIVE_CONFLICT,
    NODE_INSUFFICIENT_DEVICE,
    NODE_UNREGISTERED,
)
from hami.core.requests import PodRequest, parse_pod
from hami.protocol import handshake
from hami.scheduler.service import reason_codes


def req(*containers: dict[str, Any], annotations: dict[str, str] | None = None) -> PodRequest:
    request = parse_pod(pod(*containers, annotations=annotations), [NVIDIA])
    assert request is not None
    return request


node_shapes = st.tuples(
    st.integers(1, 4),  # devices
    st.sampled_from([2, 10]),  # split count
    st.sampled_from([8000, 16000]),  # memory
    st.sampled_from([0, 100]),  # cores (0: no core limiter)
    st.lists(st.booleans(), min_size=4, max_size=4),  # healthy
    st.sampled_from(["ok", "ok", "ok", "stale", "garbage", "none"]),
)
pod_shapes = st.tuples(st.integers(1, 3), st.integers(1, 12000), st.sampled_from([0, 30, 100]))


def build(nodes: list[Any], pods: list[Any]) -> Cluster:
    c = Cluster([NVIDIA])
    for i, (devices, split, memory, cores, healthy, state) in enumerate(nodes):
        value = register(
            [f"GPU-{i}-{d}" for d in range(devices)],
            memory=memory,
            cores=cores,
            count=split,
            healthy=healthy[:devices],
        )
        shake = "Reported_2024-05-20 09:59:00"
        if state == "stale":
            shake = "Requesting_2024-05-20 08:00:00"
        elif state == "garbage":
            value = "not,a,register"
        if state != "none":
            c.upsert_node(node(f"n{i}", value, shake=shake), NOW)
    c.refresh(NOW)
    for j, (count, memory, cores) in enumerate(pods):
        decision = c.decide(req(gpu(count=count, mem=memory, cores=cores)))
        if decision.node is not None and decision.fit is not None:
            c.reserve(f"default/p{j}", f"uid-{j}", decision.node, decision.fit)
    return c


def free_set(c: Cluster, name: str) -> list[Any]:
    state = c.nodes[name].types["nvidia"]
    return [d for d in state.devices if d.healthy and d.used < d.count and not d.exclusive_held]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(node_shapes, min_size=1, max_size=6),
    pods=st.lists(pod_shapes, max_size=12),
    ask=pod_shapes,
    percent=st.booleans(),
)
def test_summary_reasons_agree_with_the_detailed_path(
    nodes: list[Any], pods: list[Any], ask: tuple[int, int, int], percent: bool
) -> None:
    c = build(nodes, pods)
    count, memory, cores = ask
    request = req(
        gpu(count=count, mem=None if percent else memory, pct=60 if percent else None, cores=cores)
    )
    names = [*sorted(c.nodes), "ghost"]  # a name the cluster does not know
    needs = _needs(request)
    detailed = c.explain(request, names)
    cheap, allowed = nofit.reasons(
        c.nodes, names, needs, lambda allowed: c.explain(request, allowed)
    )
    assert list(cheap) == names
    for name in names:
        summary = nofit.summary_reason(c.nodes.get(name), needs)
        if summary is None:
            assert name in allowed
            assert cheap[name] == detailed[name]  # fitted in detail: the detailed reason
            continue
        assert name not in allowed
        assert cheap[name] == summary
        assert detailed[name], f"{name}: the summary rules out a node that fits"
        held = c.nodes.get(name)
        state = held.types.get("nvidia") if held is not None else None
        if (
            state is None
            or not state.available
            or summary.startswith(NODE_INSUFFICIENT_DEVICE + ":")
        ):
            assert summary == detailed[name]  # node- and type-level: the same words
            continue
        assert summary in {
            NODE_INSUFFICIENT_DEVICE,
            CARD_INSUFFICIENT_MEMORY,
            CARD_INSUFFICIENT_CORE,
            EXCLUSIVE_CONFLICT,
        }
        free = free_set(c, name)
        # Each code states a fact about the devices, checked here from the devices.
        if summary == NODE_INSUFFICIENT_DEVICE:
            assert len(free) < count
            continue
        assert len(free) >= count
        if summary == CARD_INSUFFICIENT_MEMORY:
            assert all(d.free_memory < memory for d in free)
            # some free device fails on memory in detail, so the detailed codes say so too
            assert CARD_INSUFFICIENT_MEMORY in reason_codes(detailed[name])
        elif summary == CARD_INSUFFICIENT_CORE:
            assert all(d.free_cores < cores for d in free)
        else:
            assert cores >= 100 and sum(1 for d in free if d.used == 0) < count


def test_node_and_type_level_reasons_are_the_detailed_ones() -> None:
    c = Cluster([NVIDIA])
    c.upsert_node(node("two", register(["GPU-a", "GPU-b"])), NOW)
    c.upsert_node(node("stale", register(["GPU-c"]), shake="Requesting_2024-05-20 08:00:00"), NOW)
    c.upsert_node({"metadata": {"name": "plain", "annotations": {}}}, NOW)
    c.refresh(NOW)
    request = req(gpu(count=3, mem=100))
    names = ["two", "stale", "plain", "ghost"]
    needs = _needs(request)
    cheap = {n: nofit.summary_reason(c.nodes.get(n), needs) for n in names}
    assert cheap == c.explain(request, names)
    assert cheap["two"] == f"{NODE_INSUFFICIENT_DEVICE}: 3 nvidia devices asked, node has 2"
    assert cheap["stale"] == handshake.HANDSHAKE_TIMED_OUT
    assert cheap["ghost"] == cheap["plain"] == NODE_UNREGISTERED


def big_cluster(nodes: int = nofit.DETAIL_NODES + 6) -> Cluster:
    c = Cluster([NVIDIA])
    for i in range(nodes):
        c.upsert_node(node(f"n{i:03}", register([f"GPU-{i}-0", f"GPU-{i}-1"], memory=10000)), NOW)
    c.refresh(NOW)
    return c


def test_a_large_candidate_set_gets_summary_codes_and_detail_where_the_summary_allows() -> None:
    c = big_cluster()
    # On one node a uuid selector excludes every device: the summary allows the node,
    # so it gets the detailed reason with device counts.
    request = req(
        gpu(count=1, mem=9000), annotations={"nvidia.com/nouse-gpuuuid": "GPU-0-0,GPU-0-1"}
    )
    assert c.decide(request).node is not None  # fits elsewhere
    filler = req(gpu(count=2, mem=5000))
    for i in range(1, nofit.DETAIL_NODES + 6):
        decision = c.decide(filler, [f"n{i:03}"])
        assert decision.fit is not None
        c.reserve(f"default/f{i}", f"uid-{i}", f"n{i:03}", decision.fit)
    decision = c.decide(request)
    assert decision.node is None
    assert decision.failed["n000"] == "2/2 CardUuidMismatch"
    assert {decision.failed[f"n{i:03}"] for i in range(1, nofit.DETAIL_NODES + 6)} == {
        CARD_INSUFFICIENT_MEMORY
    }


def test_a_small_candidate_set_keeps_the_detailed_reasons() -> None:
    c = big_cluster(3)
    decision = c.decide(req(gpu(count=1, mem=20000)))
    assert decision.failed == dict.fromkeys(["n000", "n001", "n002"], "2/2 CardInsufficientMemory")


def test_an_identical_request_reuses_the_answer_until_something_changes() -> None:
    c = big_cluster()
    request = req(gpu(count=1, mem=20000))
    first = c.decide(request).failed
    again = c.decide(req(gpu(count=1, mem=20000))).failed  # another pod, same shape
    assert again is first
    assert c.decide(req(gpu(count=1, mem=20001))).failed is not first  # another shape
    assert c.decide(request, ["n001", "n000"]).failed.keys() == {"n000", "n001"}
    # A record change (a reservation) makes a new answer that shows it.
    fit = c.decide(req(gpu(count=2, mem=1000, cores=100)), ["n000"]).fit
    assert fit is not None
    c.reserve("default/full", "uid-full", "n000", fit)
    after = c.decide(request).failed
    assert after is not first
    assert after["n000"] == NODE_INSUFFICIENT_DEVICE and after["n001"] == CARD_INSUFFICIENT_MEMORY
    # So does a node change: the node's type turns unavailable.
    c.upsert_node(node("n001", "not,a,register"), NOW)
    latest = c.decide(request).failed
    assert latest["n001"].startswith("invalid node register value"), latest["n001"]
    c.release("default/full")
    assert c.decide(request).failed["n000"] == CARD_INSUFFICIENT_MEMORY


def test_an_availability_reason_change_is_not_served_from_the_cache() -> None:
    c = big_cluster()
    names = sorted(c.nodes)
    request = req(gpu(count=1, mem=20000))
    assert c.decide(request, names).failed["n000"] == CARD_INSUFFICIENT_MEMORY
    value = register(["GPU-0-0", "GPU-0-1"], memory=10000)
    c.upsert_node(node("n000", value, shake="Requesting_2024-05-20 08:00:00"), NOW)
    c.refresh(NOW)
    assert c.decide(request, names).failed["n000"] == handshake.HANDSHAKE_TIMED_OUT
    # Still unavailable, for another reason: only the type's view changes.
    off = node("n000", value, shake="Requesting_2024-05-20 08:00:00")
    off["status"] = {"capacity": {"nvidia.com/gpu": "20"}, "allocatable": {"nvidia.com/gpu": "0"}}
    c.upsert_node(off, NOW)
    assert c.decide(request, names).failed["n000"].startswith("kubelet reports 0 allocatable")
    c.delete_node("n001")
    assert c.decide(request, names).failed["n001"] == NODE_UNREGISTERED


def quota(c: Cluster, mib: int) -> None:
    c.quotas.upsert(
        {
            "metadata": {"namespace": "team", "name": "q"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": str(mib)}},
        }
    )


def test_a_quota_limit_change_is_part_of_the_key() -> None:
    c = big_cluster()
    request = req(gpu(count=1, pct=60))  # 6000 MiB of these devices: checked per node
    quota(c, 4000)
    first = c.decide(request, namespace="team").failed
    assert set(first.values()) == {
        "QuotaExceeded: namespace team has 0MiB of limits.nvidia.com/gpumem in use and the "
        "pod needs 6000MiB more; ResourceQuota q allows 4000MiB"
    }
    quota(c, 5000)  # no node or record changed, only the limit
    assert {r.rpartition(" ")[2] for r in c.decide(request, namespace="team").failed.values()} == {
        "5000MiB"
    }
    quota(c, 7000)
    assert c.decide(request, namespace="team").node is not None


def test_the_cache_is_bounded() -> None:
    cache = nofit.NoFitCache(entries=2)
    for i in range(5):
        cache.put(i, nofit.Answer(7, {"n": str(i)}, ()))
    assert cache.get(0) is None
    answer = cache.get(4)
    assert answer is not None and answer.failed == {"n": "4"}


def test_the_change_log_says_which_nodes_changed_or_that_it_lost_track() -> None:
    cache = nofit.NoFitCache(changes=3)
    assert cache.changed_since(0) == set()
    for generation, name in enumerate(["a", "b", "a", "c"], start=1):
        cache.changed(generation, name)
    assert cache.changed_since(4) == set()
    assert cache.changed_since(2) == {"a", "c"}
    assert cache.changed_since(1) == {"a", "b", "c"}
    assert cache.changed_since(0) is None  # generation 1's entry was dropped


steps = st.lists(
    st.tuples(
        st.sampled_from(["fill", "free", "off", "on", "quota"]),
        st.integers(0, nofit.DETAIL_NODES + 5),
        st.integers(1, 2),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, big=st.booleans())
def test_an_answer_brought_up_to_date_equals_one_computed_afresh(
    steps: list[tuple[str, int, int]], big: bool
) -> None:
    size = nofit.DETAIL_NODES + 6 if big else 5
    c = big_cluster(size)
    names = sorted(c.nodes)
    asks = [
        req(gpu(count=1, mem=10001)),  # never fits: the summaries' reasons
        req(gpu(count=2, mem=7000)),  # fits only on a node nothing holds
        req(gpu(count=1, pct=60)),  # memory checked per node, and by the quota
        req(gpu(count=3, mem=100)),  # more devices than any node has
    ]
    held: dict[str, str] = {}
    for step, (action, index, count) in enumerate(steps):
        name = names[index % size]
        if action == "fill":
            fit = c.decide(req(gpu(count=count, mem=4000)), [name]).fit
            if fit is not None:
                c.reserve(f"team/f{step}", f"uid-{step}", name, fit)
                held[f"team/f{step}"] = name
        elif action == "free" and held:
            c.release(sorted(held)[index % len(held)])
        elif action == "off":
            c.upsert_node(node(name, "not,a,register"), NOW)
        elif action == "on":
            c.upsert_node(
                node(name, register([f"GPU-{name}-0", f"GPU-{name}-1"], memory=10000)), NOW
            )
        else:
            quota(c, 5000 + 1000 * count)
        for ask in asks:
            kept = c.decide(ask, names, namespace="team")
            fresh_cluster_cache = c.no_fit
            c.no_fit = nofit.NoFitCache()
            fresh = c.decide(ask, names, namespace="team")
            c.no_fit = fresh_cluster_cache
            assert (kept.node is None) == (fresh.node is None)
            assert kept.failed == fresh.failed
