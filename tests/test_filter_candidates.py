"""Decisions read the candidate list only as far as they need (issue 20 item 1): however
the list comes (a fresh copy per call, shuffled, a strict subset, a superset with unknown
names, a look-alike of one seen before), the decision and the no-fit answer are those of
the plain rule, computed here from scratch."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any
from unittest.mock import patch

import yaml
from _core_helpers import NOW, NVIDIA, gpu, node, register
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_nofit import req

from hami.core import cluster as cluster_module
from hami.core import nofit
from hami.core.cluster import Candidates, Cluster, _needs
from hami.core.fit import BINPACK, NodeFit, fit_pod
from hami.core.requests import PodRequest

ROOT = Path(__file__).resolve().parent.parent


def random_cluster(rng: random.Random, nodes: int, policy: str = BINPACK) -> Cluster:
    c = Cluster([NVIDIA], node_policy=policy)
    for i in range(nodes):
        devices = rng.randint(1, 4)
        value = register(
            [f"GPU-{i}-{d}" for d in range(devices)],
            memory=rng.choice((8000, 16000)),
            count=rng.choice((2, 10)),
            healthy=[rng.random() > 0.1 for _ in range(devices)],
        )
        shake = rng.choice(
            ["Reported_2024-05-20 09:59:00"] * 5 + ["Requesting_2024-05-20 08:00:00"]
        )
        c.upsert_node(node(f"n{i}", value, shake=shake), NOW)
    c.refresh(NOW)
    for j in range(nodes * 2):
        fill(c, rng, f"default/fill-{j}")
    return c


def ask(rng: random.Random) -> PodRequest:
    count = rng.randint(1, 3)
    if rng.random() < 0.15:  # nothing can take it
        return req(gpu(count=count, mem=50000))
    return req(gpu(count=count, mem=rng.randint(500, 12000), cores=rng.choice((0, 30, 100))))


def fill(c: Cluster, rng: random.Random, key: str) -> None:
    decision = c.decide(ask(rng))
    if decision.node is not None and decision.fit is not None:
        c.reserve(key, key, decision.node, decision.fit)


def expected(c: Cluster, request: PodRequest, names: list[Any]) -> tuple[str | None, Any]:
    """The plain rule: the candidates in policy order, the first 4 that fit, the best of
    them; when none fits, every candidate's reason (summary codes above 64 names)."""
    wanted = {str(n) for n in names}
    binpack = (request.node_policy or c.node_policy) == BINPACK
    policy = request.device_policy or c.device_policy
    found = []
    for _key, name in c._desc if binpack else c._asc:
        if name not in wanted:
            continue
        state = c.nodes[name]
        result = fit_pod(state.views, request, policy)
        if isinstance(result, NodeFit):
            score = state.utilisation + result.utilisation_delta / (len(state.devices) or 1)
            found.append((-score if binpack else score, name))
            if len(found) == 4:
                break
    if found:
        return min(found)[1], None
    strings = [str(n) for n in names]
    if len(strings) <= nofit.DETAIL_NODES:
        return None, list(c.explain(request, strings).items())
    failed, _ = nofit.reasons(
        c.nodes, strings, _needs(request), lambda allowed: c.explain(request, allowed)
    )
    return None, list(failed.items())


def some_list(rng: random.Random, names: list[str], previous: list[Any]) -> list[Any]:
    kind = rng.randrange(8)
    if kind == 0:
        return list(names)  # every node, the order the cluster sorts them in
    if kind == 1:
        return rng.sample(names, len(names))  # every node, shuffled
    if kind == 2:
        if rng.random() < 0.5:
            return list(previous)  # the list seen last, freshly decoded
        jittered = list(previous)  # shuffled a little, as kube-scheduler's parallel filter
        for _ in range(len(jittered) // 4):
            i = rng.randrange(max(1, len(jittered) - 3))
            j = min(len(jittered) - 1, i + rng.randint(1, 3))
            jittered[i], jittered[j] = jittered[j], jittered[i]
        return jittered
    if kind == 3 and previous:  # the last one with a name swapped for one it lacks
        changed = list(previous)
        changed[rng.randrange(len(changed))] = rng.choice([*names, "ghost"])
        return changed
    if kind == 4:
        return rng.sample(names, rng.randint(1, max(1, len(names) // 10)))  # a few
    if kind == 5:
        return rng.sample(names, len(names) * 3 // 4)  # most, a strict subset
    if kind == 6:  # every node and names the cluster does not know
        return [*rng.sample(names, len(names)), "ghost-1", "ghost-2"]
    return [*names[: len(names) // 2], *names[: len(names) // 2]]  # repeats


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    size=st.sampled_from([12, 90, 250]),
    spread=st.booleans(),
    near=st.sampled_from([cluster_module.NEAR, 2]),  # 2: names moved out of reach too
    scans=st.sampled_from([cluster_module.SCANS, 0]),
)
def test_decisions_do_not_depend_on_how_the_list_comes(
    seed: int, size: int, spread: bool, near: int, scans: int
) -> None:
    with patch.object(cluster_module, "NEAR", near), patch.object(cluster_module, "SCANS", scans):
        decide_in_turn(random.Random(seed), size, spread)


def decide_in_turn(rng: random.Random, size: int, spread: bool) -> None:
    c = random_cluster(rng, size, "spread" if spread else BINPACK)
    names = sorted(c.nodes)
    previous: list[Any] = list(names)
    for step in range(25):
        candidates = some_list(rng, names, previous)
        previous = candidates
        request = ask(rng)
        want_node, want_failed = expected(c, request, candidates)
        decision = c.decide(request, list(candidates))  # a new list object, as over HTTP
        assert decision.node == want_node, step
        if want_node is None:
            assert list(decision.failed.items()) == want_failed, step
        elif decision.node is not None and decision.fit is not None and rng.random() < 0.5:
            c.reserve(f"default/step-{step}", "u", decision.node, decision.fit)
        if rng.random() < 0.3:  # other changes between calls
            victim = rng.choice(sorted(c.pods) or ["none/none"])
            c.release(victim)


def test_the_no_fit_cache_tells_look_alike_lists_apart() -> None:
    rng = random.Random(7)
    c = random_cluster(rng, 120)
    impossible = req(gpu(count=2, mem=50000))
    names = sorted(c.nodes)
    # same length, same sampled names, one name different where no sample looks
    key = nofit.sampled_key(names)
    assert isinstance(key, tuple)
    sampled = {names.index(s) for s in key[1:] if s in names}
    where = next(i for i in range(len(names)) if i not in sampled)
    look_alike = list(names)
    look_alike[where] = "ghost"
    assert nofit.sampled_key(look_alike) == nofit.sampled_key(names)
    for candidates in (names, look_alike, names, look_alike):
        failed = c.decide(impossible, list(candidates)).failed
        assert list(failed) == candidates
        assert failed == dict(expected(c, impossible, candidates)[1])
    fill(c, rng, "default/more")  # a change: the kept answers are brought up to date
    for candidates in (look_alike, names):
        failed = c.decide(impossible, list(candidates)).failed
        assert list(failed.items()) == expected(c, impossible, candidates)[1]


def test_a_long_list_is_read_whole_only_when_it_changes() -> None:
    rng = random.Random(3)
    c = random_cluster(rng, 200)
    names = sorted(c.nodes)
    reads: list[int] = []
    remember = c._remember

    def counted(cands: Candidates) -> None:
        reads.append(len(cands))
        remember(cands)

    c._remember = counted  # type: ignore[method-assign]
    for step in range(12):  # the same names in fresh lists: read whole once at most
        request = ask(rng)
        assert c.decide(request, list(names)).node == expected(c, request, names)[0], step
    assert len(reads) <= 1
    shuffled = rng.sample(names, len(names))
    request = req(gpu(count=1, mem=1000))
    assert c.decide(request, shuffled).node == expected(c, request, shuffled)[0]
    chosen = expected(c, request, names)[0]
    without = [n for n in names if n != chosen]
    assert c.decide(request, without).node == expected(c, request, without)[0]


def test_names_that_are_not_strings_count_as_their_text() -> None:
    c = Cluster([NVIDIA])
    for i in range(100):
        c.upsert_node(node(str(i), register([f"GPU-{i}"])), NOW)
    c.refresh(NOW)
    request = req(gpu(count=1, mem=1000))
    as_text = [str(i) for i in range(100)]
    as_numbers: list[Any] = list(range(100))
    assert c.decide(request, as_numbers).node == c.decide(request, as_text).node
    odd: list[Any] = [{"a": 1}, 5]
    assert c.decide(request, odd).node == "5"
    impossible = req(gpu(count=1, mem=50000))
    failed = c.decide(impossible, [*as_numbers, None]).failed  # type: ignore[list-item]
    assert list(failed) == [*as_text, "None"]
    assert Candidates([1, "2"]).strings() == ["1", "2"]
    assert Candidates(["a", "b"]).strings() == ["a", "b"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32))
def test_grouped_reasons_equal_per_node_reasons(seed: int) -> None:
    rng = random.Random(seed)
    c = random_cluster(rng, 80)
    names = [*rng.sample(sorted(c.nodes), 70), "ghost"]
    for step in range(6):
        request = ask(rng)
        needs = _needs(request)
        c.summaries.sync(c.nodes)

        def detail(allowed: list[str], r: PodRequest = request) -> dict[str, str]:
            return c.explain(r, allowed)

        grouped = c.summaries.reasons(names, needs, detail)
        plain = nofit.reasons(c.nodes, names, needs, detail)
        assert list(grouped[0].items()) == list(plain[0].items()), step
        assert grouped[1] == plain[1]
        assert c.summaries.may_fit_anywhere(needs) == any(
            nofit.summary_reason(n, needs) is None for n in c.nodes.values()
        )
        fill(c, rng, f"default/g-{step}")
        if rng.random() < 0.5:
            c.delete_node(rng.choice(sorted(c.nodes)))


def test_kube_scheduler_keeps_its_adaptive_percentage_of_nodes_to_score() -> None:
    """kube-scheduler sends the extender the feasible nodes it found, at most
    percentageOfNodesToScore of them (adaptive by default: 5 % at 65,000 nodes); a config
    that raised it would send every node to every filter call."""
    from test_chart import configs, render

    _, rendered = configs(render())
    shipped = yaml.safe_load((ROOT / "config" / "kube-scheduler.yaml").read_text())
    for scheduler_config in (rendered, shipped):
        assert "percentageOfNodesToScore" not in scheduler_config
        for profile in scheduler_config.get("profiles", []):
            assert "percentageOfNodesToScore" not in profile
