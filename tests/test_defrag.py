"""The ``defrag`` node policy (hami.core.defrag, hami.core.defragpolicy): the measure, its
fast form, and decisions through ``Cluster.decide`` that the binpack and spread policies
get wrong."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from _core_helpers import NOW, NVIDIA, gpu, node, pod, register
from hypothesis import given, settings
from hypothesis import strategies as st

from hami import config
from hami.core import defrag
from hami.core.cluster import Cluster
from hami.core.defragpolicy import DEFRAG
from hami.core.noderesources import RoomLedger
from hami.core.requests import parse_pod
from hami.scheduler.webhook import mutations


def shape(count: int = 1, cores: int = 50, cpu: int = 1000, memory: int = 1024) -> defrag.Shape:
    return defrag.Shape("nvidia", count, cores, 0, cores, (), (), cpu, memory)


def device(free: int, *, idle: bool | None = None, slots: int = 10) -> defrag.DeviceKey:
    idle = free == 100 if idle is None else idle
    return ("V100", "nvidia", slots, free, 32768 * free // 100, 32768, idle)


# ------------------------------------------------------------------ the measure


def test_stranded_counts_what_a_shape_cannot_use() -> None:
    devices = [device(100), device(30), device(0)]
    assert defrag.stranded(shape(cores=50), devices, cpu_ok=True) == 30  # the 30 % left
    assert defrag.stranded(shape(cores=20), devices, cpu_ok=True) == 0
    assert defrag.stranded(shape(cores=100), devices, cpu_ok=True) == 30  # wants idle
    # two whole devices asked, one idle: everything is stranded for it
    assert defrag.stranded(shape(count=2, cores=100), devices, cpu_ok=True) == 130
    # the node's CPU or memory cannot take the pod: everything is stranded
    assert defrag.stranded(shape(cores=20), devices, cpu_ok=False) == 130
    # no free share slot: the device's free cores are stranded
    assert defrag.stranded(shape(cores=20), [device(60, slots=0)], cpu_ok=True) == 60


def test_window_weighs_by_demand_and_keeps_the_most_demanded() -> None:
    window = defrag.ShapeWindow(window=100, max_shapes=2)
    for _ in range(10):
        window.observe(shape(cores=10))  # 10 pods x 10 % = 100
    window.observe(shape(count=8, cores=100))  # 1 pod x 800 %
    window.observe(shape(cores=5))  # 1 x 5: dropped (only two shapes weighed)
    window.force_reweigh()
    weights = dict(window.weights)
    assert set(weights) == {shape(cores=10), shape(count=8, cores=100)}
    assert weights[shape(count=8, cores=100)] == pytest.approx(800 / 900)


def test_window_forgets_shapes_older_than_its_length() -> None:
    window = defrag.ShapeWindow(window=4)
    for _ in range(4):
        window.observe(shape(cores=10))
    for _ in range(4):
        window.observe(shape(cores=70))
    window.force_reweigh()
    assert [s for s, _w in window.weights] == [shape(cores=70)]


def test_a_steady_workload_keeps_its_weights_and_a_new_one_replaces_them() -> None:
    """The weights (and every cached node state with them) change only when the recent
    demand moved by REWEIGH_TOLERANCE or more, not at every REWEIGH_EVERY pods."""
    import random

    rng = random.Random(7)
    window = defrag.ShapeWindow(window=400)
    mix = [shape(cores=10), shape(cores=50), shape(count=2, cores=100)]
    for _ in range(4000):  # ten windows of one mix, drawn at random
        window.observe(rng.choice(mix))
    settled = window.generation
    for _ in range(4000):
        window.observe(rng.choice(mix))
    assert window.generation == settled  # sampling noise alone never reweighs
    for _ in range(800):  # the workload changes: only 30 % shares now
        window.observe(shape(cores=30))
    assert window.generation > settled
    # the weights in use are within the tolerance of the window's pure new mix
    assert defrag.moved(window.weights, [(shape(cores=30), 1.0)]) < defrag.REWEIGH_TOLERANCE
    assert defrag.moved(window.weights, window.weights) == 0.0


def test_a_varied_workload_takes_a_new_set_at_most_once_per_window() -> None:
    """Hundreds of shapes for 48 weights: sampling alone moves the weights past the
    tolerance at most checks; once the window is full such a move is taken at most once
    per window's length of pods, while a real change of workload is taken at once."""
    import random

    rng = random.Random(3)
    window = defrag.ShapeWindow(window=400, max_shapes=8)
    mix = [shape(cores=c, cpu=cpu) for c in (10, 20, 30, 40, 50) for cpu in range(1000, 9000, 500)]
    for _ in range(800):
        window.observe(rng.choice(mix))
    bumps = []
    for i in range(4000):
        before = window.generation
        window.observe(rng.choice(mix))
        if window.generation != before:
            bumps.append(i)
    assert all(b - a >= 400 for a, b in itertools.pairwise(bumps))
    assert len(bumps) <= 4000 // 400
    settled = window.generation
    for _ in range(300):  # a new workload of whole devices: taken before a window passes
        window.observe(shape(count=2, cores=100))
    assert window.generation > settled


keys = st.tuples(
    st.lists(
        st.builds(
            lambda free, idle, slots, model: (
                model,
                "nvidia",
                slots,
                free,
                327 * free,
                32700,
                idle,
            ),
            st.sampled_from([0, 5, 20, 50, 80, 100]),
            st.booleans(),
            st.integers(0, 3),
            st.sampled_from(["A10", "T4"]),
        ),
        max_size=8,
    ).map(lambda d: tuple(sorted(d))),
    st.integers(0, 4),
    st.integers(0, 4),
)
shapes = st.builds(
    lambda count, cores, cpu, mem, spec: defrag.Shape(
        "nvidia", count, cores if count == 1 else 100, 0, cores, spec, (), cpu, mem
    ),
    st.sampled_from([1, 1, 2, 4, 8]),
    st.sampled_from([5, 25, 50, 100]),
    st.sampled_from([1000, 8000, 32000]),
    st.sampled_from([1024, 65536]),
    st.sampled_from([(), ("t4",)]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(shapes, min_size=1, max_size=30), st.lists(keys, min_size=1, max_size=10))
def test_the_bit_mask_form_equals_the_plain_definition(
    seen: list[defrag.Shape], nodes: list[defrag.NodeKey]
) -> None:
    window = defrag.ShapeWindow()
    for s in seen:
        window.observe(s)
    window.force_reweigh()
    cache = defrag.FragmentCache(window)
    for key in nodes:
        assert cache(key) == pytest.approx(defrag.fragment(window, key))


# ------------------------------------------------------------------ decisions


def cluster_with(*nodes: tuple[str, int]) -> Cluster:
    cluster = Cluster([NVIDIA], node_policy=DEFRAG, device_policy="binpack")
    for name, gpus in nodes:
        uuids = [f"{name}-g{i}" for i in range(gpus)]
        cluster.upsert_node(node(name, register(uuids)), NOW)
    return cluster


def place(cluster: Cluster, obj: dict[str, Any], room: tuple[int, int] = (0, 0)) -> str | None:
    request = parse_pod(obj, [NVIDIA])
    assert request is not None
    decision = cluster.decide(request, pod_room=room)
    if decision.node is None or decision.fit is None:
        return None
    key = f"default/{obj['metadata']['name']}"
    cluster.reserve(key, obj["metadata"]["uid"], decision.node, decision.fit)
    return decision.node


def share(name: str, cores: int) -> dict[str, Any]:
    return pod(gpu(pct=cores, cores=cores), name=name, uid=name)


def whole(name: str, count: int = 1) -> dict[str, Any]:
    return pod(gpu(count=count, cores=100, pct=100), name=name, uid=name)


def held(cluster: Cluster, name: str) -> dict[str, int]:
    """uuid -> cores held on that node."""
    return {uuid: use.cores for uuid, use in cluster.nodes[name].usage.items()}


def test_a_share_goes_where_it_completes_a_device_not_to_an_idle_one() -> None:
    cluster = cluster_with(("a", 2), ("b", 2))
    # whole-device pods and 50 % shares both come
    assert place(cluster, whole("w0")) is not None
    assert place(cluster, whole("w1")) is not None
    assert place(cluster, share("s0", 50)) is not None
    assert place(cluster, share("s1", 50)) is not None
    # the second share completed the first one's device: one device is still idle
    cores = [c for name in ("a", "b") for c in held(cluster, name).values()]
    assert sorted(cores) == [100, 100, 100]
    assert place(cluster, whole("w2")) is not None


def on(name: str, cores: int, uuid: str) -> dict[str, Any]:
    """A share pinned to one device (setting the scene)."""
    obj = share(name, cores)
    obj["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] = uuid
    return obj


@pytest.mark.parametrize("policy", ["binpack", DEFRAG])
def test_binpack_breaks_an_idle_device_that_defrag_keeps(policy: str) -> None:
    """a: device 0 20 % used, device 1 idle; b: device 0 80 % used, device 1 idle. A 50 %
    share: binpack takes the fuller node b, where only the idle device fits it; defrag
    puts it on a's device 0, and both nodes keep an idle device for whole-device pods."""
    cluster = cluster_with(("a", 2), ("b", 2))
    assert place(cluster, on("x", 20, "a-g0")) == "a"
    assert place(cluster, on("y", 80, "b-g0")) == "b"
    cluster.node_policy = policy
    for _ in range(3):
        cluster.defrag.shapes.observe(shape(cores=100, count=1))
        cluster.defrag.shapes.observe(shape(cores=50))
    node_name = place(cluster, share("s", 50))
    idle = [
        uuid
        for name in ("a", "b")
        for uuid in (f"{name}-g0", f"{name}-g1")
        if uuid not in held(cluster, name)
    ]
    if policy == DEFRAG:
        assert node_name == "a" and held(cluster, "a") == {"a-g0": 70}
        assert idle == ["a-g1", "b-g1"]
    else:
        assert node_name == "b" and idle == ["a-g1"]


def test_cpu_and_memory_of_the_node_count() -> None:
    """Two identical nodes; b's CPU is nearly used up, so its idle device is already
    useless to the pods that come: the share goes there, a stays whole."""
    cluster = cluster_with(("a", 1), ("b", 1))
    cluster.set_node_room("a", 32000, 131072)
    cluster.set_node_room("b", 2000, 131072)
    window = cluster.defrag.shapes
    for _ in range(5):
        window.observe(defrag.Shape("nvidia", 1, 100, 0, 100, (), (), 8000, 8192))
    assert place(cluster, share("s", 50), room=(1000, 1024)) == "b"
    # and a pod whose CPU request does not fit b's room goes to a
    assert place(cluster, share("t", 30), room=(4000, 1024)) == "a"


def test_ties_are_deterministic_by_name() -> None:
    names = [place(cluster_with(("c", 1), ("a", 1), ("b", 1)), share("s", 20)) for _ in range(3)]
    assert names == ["a", "a", "a"]


def test_no_fit_answers_with_reasons() -> None:
    cluster = cluster_with(("a", 1))
    request = parse_pod(whole("w", 2), [NVIDIA])
    assert request is not None
    decision = cluster.decide(request)
    assert decision.node is None
    assert decision.failed.get("a")


def test_a_namespace_quota_moves_the_pod_to_the_next_best_node() -> None:
    cluster = cluster_with(("a", 1), ("b", 1))
    place(cluster, share("s0", 50))
    first = next(iter(n for n in ("a", "b") if held(cluster, n)))
    rejects = {first}

    request = parse_pod(share("s1", 50), [NVIDIA])
    assert request is not None
    names, indexed = cluster._schedulable(None)
    choice, _looked = cluster.defrag.choose(
        names, indexed, request, "binpack", (0, 0), lambda fit: _node_of(fit) in rejects
    )
    assert choice is not None and choice.node != first


def _node_of(fit: Any) -> str:
    uuid = next(iter(fit.usage))
    return str(uuid).split("-g")[0]


def test_pods_annotated_defrag_use_it_under_another_default() -> None:
    cluster = Cluster([NVIDIA], node_policy="spread", device_policy="binpack")
    for name in ("a", "b"):
        cluster.upsert_node(node(name, register([f"{name}-g0", f"{name}-g1"])), NOW)
    annotated = pod(
        gpu(pct=50, cores=50),
        name="p",
        uid="p",
        annotations={"hami.io/node-scheduler-policy": "defrag"},
    )
    request = parse_pod(annotated, [NVIDIA])
    assert request is not None and request.node_policy == DEFRAG and not request.warnings
    first = cluster.decide(request)
    assert first.node is not None and first.fit is not None
    cluster.reserve("default/p", "p", first.node, first.fit)
    again = parse_pod({**annotated, "metadata": {**annotated["metadata"], "name": "q"}}, [NVIDIA])
    assert again is not None
    # spread would pick the other, empty node; defrag completes the half-used device
    assert cluster.decide(again).node == first.node


# ------------------------------------------------------------------ the scheduler's inputs


def test_room_ledger_counts_bound_unfinished_pods_only() -> None:
    ledger = RoomLedger()
    node_obj = {
        "metadata": {"name": "n"},
        "status": {"allocatable": {"cpu": "8", "memory": "16Gi"}},
    }
    assert ledger.set_node("n", node_obj) == ["n"]
    assert ledger.set_node("n", node_obj) == []  # unchanged
    running = {
        "metadata": {"name": "p", "namespace": "d"},
        "spec": {
            "nodeName": "n",
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}}
            ],
        },
        "status": {"phase": "Running"},
    }
    assert ledger.upsert_pod("d/p", running) == ["n"]
    assert ledger.free("n") == (6500, 15360)
    assert ledger.upsert_pod("d/p", running) == []
    pending = {**running, "spec": {**running["spec"], "nodeName": None}}
    assert ledger.upsert_pod("d/q", pending) == []  # not bound: kube-scheduler's business
    done = {**running, "status": {"phase": "Succeeded"}}
    assert ledger.upsert_pod("d/p", done) == ["n"]
    assert ledger.free("n") == (8000, 16384)
    assert ledger.upsert_pod("d/p", running) == ["n"]
    assert ledger.delete_pod("d/p") == ["n"] and ledger.free("n") == (8000, 16384)
    assert ledger.free("unknown") is None


def test_webhook_routes_pods_without_devices_only_when_asked() -> None:
    cpu_pod = pod({"name": "c", "resources": {"requests": {"cpu": "1"}}}, name="cpu", uid="cpu")
    assert mutations(cpu_pod, [NVIDIA], "hami-scheduler") == []
    routed = mutations(cpu_pod, [NVIDIA], "hami-scheduler", route_cpu_pods=True)
    assert routed == [{"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"}]
    empty = pod({"name": "c"}, name="e", uid="e")  # asks for nothing: left to kube-scheduler
    assert mutations(empty, [NVIDIA], "hami-scheduler", route_cpu_pods=True) == []
    other = {**cpu_pod, "spec": {**cpu_pod["spec"], "schedulerName": "someone-else"}}
    assert mutations(other, [NVIDIA], "hami-scheduler", route_cpu_pods=True) == []


def test_defrag_cpu_pods_needs_the_defrag_policy() -> None:
    with pytest.raises(config.ConfigError, match=r"defrag_cpu_pods: needs scheduler\.node_policy"):
        config.from_mapping({"scheduler": {"defrag_cpu_pods": True}}, env={})
    cfg = config.from_mapping(
        {"scheduler": {"defrag_cpu_pods": True, "node_policy": "defrag"}}, env={}
    )
    assert cfg.scheduler.defrag_cpu_pods


# ------------------------------------------------------------------ the caches


def uncached_costs(
    cluster: Cluster, request: Any, room: tuple[int, int], free_by_model: dict[str, int]
) -> dict[str, float]:
    """The same costs from a policy with nothing cached but the window, the nodes' free
    CPU and memory, and the free cores per model the pressure term read."""
    from hami.core.defragpolicy import DefragPolicy

    fresh = DefragPolicy()
    fresh.shapes = cluster.defrag.shapes
    fresh.fragment = defrag.FragmentCache(fresh.shapes)
    fresh.room = dict(cluster.defrag.room)
    fresh.free_by_model = free_by_model
    names, indexed = cluster._schedulable(None)
    return fresh.costs(names, indexed, request, cluster.device_policy, room)


steps = st.lists(
    st.one_of(
        st.tuples(st.just("place"), st.sampled_from([10, 30, 50, 100]), st.integers(0, 3)),
        st.tuples(st.just("room"), st.sampled_from(["a", "b", "c"]), st.integers(0, 8)),
        st.tuples(st.just("release"), st.integers(0, 40), st.just(0)),
        # a node removed, or added (a name seen before comes back in another state)
        st.tuples(st.just("churn"), st.sampled_from(["b", "d", "e"]), st.integers(1, 4)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_cached_answers_equal_answers_worked_out_afresh(ops: list[tuple[str, Any, int]]) -> None:
    """Placements, releases, room changes and nodes removed and added in any order: every
    decision's costs, read through the per-key answers and the nodes' columns (a slot
    freed by a removed node is given to the next new one), equal the costs a policy with
    nothing cached works out, and the decision takes the cheapest of them."""
    cluster = cluster_with(("a", 2), ("b", 2), ("c", 3))
    placed: list[tuple[str, str]] = []
    for i, (op, arg, extra) in enumerate(ops):
        if op == "room" and arg in cluster.nodes:
            cluster.set_node_room(arg, 1000 * extra, 2048 * extra)
        elif op == "release" and placed:
            cluster.release(placed.pop(arg % len(placed))[0])
        elif op == "churn" and arg in cluster.nodes:
            cluster.delete_node(arg)
            placed = [(key, where) for key, where in placed if where != arg]
        elif op == "churn":
            uuids = [f"{arg}{i}-g{j}" for j in range(extra)]
            cluster.upsert_node(node(arg, register(uuids)), NOW)
            cluster.set_node_room(arg, 3000 * extra, 4096 * extra)
        elif op == "place":
            obj = whole(f"p{i}") if arg == 100 else share(f"p{i}", arg)
            room = (500 * extra, 1024 * extra)
            request = parse_pod(obj, [NVIDIA])
            assert request is not None
            cluster.defrag.shapes.observe(defrag.Shape("nvidia", 1, arg, 0, arg, (), (), *room))
            # the same request for pods of other CPU and memory sizes first: a result kept
            # for one size must not be read for a size it does not hold for
            for size in (*((500 * e, 1024 * e) for e in (3, 0, 2, 1)), room):
                free_by_model = dict(cluster.defrag.free_by_model)
                asked = cluster.weigh(request, None, size, observe=False)
                assert asked == uncached_costs(cluster, request, size, free_by_model)
            free_by_model = dict(cluster.defrag.free_by_model)
            cached = cluster.weigh(request, None, room, observe=False)
            decision = cluster.decide(request, pod_room=room)
            if decision.node is None or decision.fit is None:
                continue
            assert cached[decision.node] == pytest.approx(min(cached.values()))
            cluster.reserve(f"default/p{i}", f"p{i}", decision.node, decision.fit)
            placed.append((f"default/p{i}", decision.node))


def plain_share_costs(
    cluster: Cluster, request: Any, pod_room: tuple[int, int]
) -> dict[str, float]:
    """A one-share pod's cost per node by the plain definitions (``defrag.fragment``,
    ``defrag.starved``), with nothing of the policy's shortcuts: the cheapest device's
    fragment increase, plus the cores the node's CPU and memory can no longer feed. (No
    pressure term: one device model, where it is zero but for rounding.)"""
    from hami.core.defragpolicy import STARVED_WEIGHT
    from hami.core.fit import device_reason

    window = cluster.defrag.shapes
    (item,) = request.containers[0]
    selectors = request.selectors_for(item.type_word)
    costs: dict[str, float] = {}
    for name, state in cluster.nodes.items():
        room = cluster.defrag.room[name]
        cpu_left, memory_left = room[0] - pod_room[0], room[1] - pod_room[1]
        if cpu_left < 0 or memory_left < 0:
            continue
        view = state.views["nvidia"]
        devices = [defrag.device_key("nvidia", d) for d in view.devices]
        before = defrag.node_key(devices, window.covered(*room))
        options = []
        for i, device in enumerate(view.devices):
            if device_reason(device, item, selectors, None) is not None:
                continue
            after = list(devices)
            current = after[i]
            assert current is not None
            after[i] = defrag.taken(current, item.memory_on(device.total_memory), item.cores)
            options.append(
                defrag.fragment(
                    window, defrag.node_key(after, window.covered(cpu_left, memory_left))
                )
                - defrag.fragment(window, before)
            )
        if not options:
            continue
        free = sum(d[3] for d in before[0])
        starved = defrag.starved(max(0, free - item.cores), cpu_left, memory_left, window)
        costs[name] = min(options) + STARVED_WEIGHT * (
            starved - defrag.starved(free, room[0], room[1], window)
        )
    return costs


def test_one_record_per_node_gives_the_cost_for_pods_of_every_size() -> None:
    """Per node and request one record is kept, read for pods of every CPU and memory size
    (the answer where the pod leaves every shape's pod room, the others by room steps, the
    starved cores worked out per pod). Nodes from tight to roomy, pods asked smallest first
    then largest first: every cost equals the plain definition's, so a record read for a
    size it does not describe shows."""
    cluster = cluster_with(*((f"n{i}", 2) for i in range(8)), ("solo", 1))
    for i in range(8):  # free CPU 2-256 cores, memory 4-512 GiB
        cluster.set_node_room(f"n{i}", 2000 << i, 4096 << i)
    # few free cores, which its CPU and memory feed for any of the pods below, but pods of
    # the larger sizes leave too little for some shapes' pods
    cluster.set_node_room("solo", 5000, 10240)
    for cores, e in itertools.product((20, 50), range(7)):
        shape = defrag.Shape("nvidia", 1, cores, 0, cores, (), (), 500 * e, 1024 * e)
        cluster.defrag.shapes.observe(shape)
    cluster.defrag.shapes.force_reweigh()
    assert cluster.defrag.shapes.cpu_per_core > 0 and cluster.defrag.shapes.memory_per_core > 0
    assert place(cluster, share("first", 30), (1000, 2048)) is not None  # devices differ
    # a share on the one-device node
    request = parse_pod(share("solo", 30), [NVIDIA])
    assert request is not None
    decision = cluster.decide(request, ["solo"], pod_room=(1000, 2048))
    assert decision.node == "solo" and decision.fit is not None
    cluster.reserve("default/solo", "solo", "solo", decision.fit)
    request = parse_pod(share("p", 20), [NVIDIA])
    assert request is not None
    # CPU and memory apart, so each is tried with the other one plentiful
    sizes = list(itertools.product(range(0, 3001, 200), range(0, 6145, 256)))
    filled = cluster.defrag.filled
    for order in (sizes, sizes[::-1]):
        for size in order:
            cached = cluster.weigh(request, None, size, observe=False)
            plain = plain_share_costs(cluster, request, size)
            assert cached.keys() == plain.keys(), size
            for name, cost in cached.items():
                assert cost == pytest.approx(plain[name], abs=1e-9), (size, name)
    # one row per node, filled at the first size, served all of those sizes
    assert cluster.defrag.filled - filled == 9


def test_the_decision_takes_the_cheapest_node_of_two_models() -> None:
    """Nodes from tight to roomy, of two models (the pressure term differs between them),
    pods of every size asked smallest first then largest first: the node chosen always
    has the least of every node's costs (``weigh``)."""
    cluster = cluster_with(*((f"n{i}", 2) for i in range(8)), ("solo", 1))
    for i in range(4):  # the other model: the pressure term differs between them
        uuids = [f"t{i}-g{j}" for j in range(2)]
        cluster.upsert_node(node(f"t{i}", register(uuids, model="NVIDIA-A100", memory=40960)), NOW)
    for i in range(8):
        cluster.set_node_room(f"n{i}", 2000 << i, 4096 << i)
    for i in range(4):
        cluster.set_node_room(f"t{i}", 3000 << (2 * i), 6144 << (2 * i))
    cluster.set_node_room("solo", 5000, 10240)
    for cores, e in itertools.product((20, 50), range(7)):
        shape = defrag.Shape(
            "nvidia", 1, cores, 0, cores, ("a100",) if e % 3 else (), (), 500 * e, 1024 * e
        )
        cluster.defrag.shapes.observe(shape)
    cluster.defrag.shapes.force_reweigh()
    assert place(cluster, share("first", 30), (1000, 2048)) is not None
    request = parse_pod(share("p", 20), [NVIDIA])
    assert request is not None
    sizes = list(itertools.product(range(0, 3001, 250), range(0, 6145, 512)))
    for order in (sizes, sizes[::-1]):
        for size in order:
            decision = cluster.decide(request, None, pod_room=size)
            costs = cluster.weigh(request, None, size, observe=False)
            if not costs:
                assert decision.node is None, size
                continue
            assert decision.node is not None, size
            assert costs[decision.node] == pytest.approx(min(costs.values()), abs=1e-9), size


def test_names_repeated_unknown_or_removed_do_not_change_the_decision() -> None:
    """The candidate list as kube-scheduler may send it: a name twice, a name the cluster
    never saw, a node removed since it was weighed (its slot then reused by a new node).
    The decision and its costs are those of the plain list of the nodes that exist."""
    cluster = cluster_with(("a", 2), ("b", 2), ("c", 1))
    for name, cpu in (("a", 4000), ("b", 16000), ("c", 8000)):
        cluster.set_node_room(name, cpu, 8 * cpu)
    assert place(cluster, share("first", 30), (1000, 2048)) is not None
    request = parse_pod(share("p", 20), [NVIDIA])
    assert request is not None
    plain = cluster.decide(request, ["a", "b"], pod_room=(1000, 2048))
    noisy = cluster.decide(request, ["b", "ghost", "a", "b", "c", "a"], pod_room=(1000, 2048))
    assert plain.node is not None and plain.fit is not None
    assert noisy.node == cluster.decide(request, ["a", "b", "c"], pod_room=(1000, 2048)).node
    assert cluster.weigh(request, ["a", "ghost", "a", "b"], (1000, 2048), observe=False) == (
        cluster.weigh(request, ["a", "b"], (1000, 2048), observe=False)
    )
    # "c" goes; a new node "d" takes its slot, in another state: its own cost, not c's
    before = cluster.weigh(request, ["a", "b", "c"], (1000, 2048), observe=False)
    cluster.delete_node("c")
    cluster.upsert_node(node("d", register(["d-g0", "d-g1", "d-g2"])), NOW)
    cluster.set_node_room("d", 64000, 512000)
    after = cluster.weigh(request, ["a", "b", "c", "d"], (1000, 2048), observe=False)
    assert "c" not in after and after.keys() == {"a", "b", "d"}
    assert {k: after[k] for k in ("a", "b")} == {k: before[k] for k in ("a", "b")}
    fresh = cluster_with(("d", 3))
    fresh.set_node_room("d", 64000, 512000)
    fresh.defrag.shapes = cluster.defrag.shapes
    fresh.defrag.fragment = defrag.FragmentCache(fresh.defrag.shapes)
    assert after["d"] == pytest.approx(
        fresh.weigh(request, ["d"], (1000, 2048), observe=False)["d"], abs=1e-9
    )


def test_a_node_states_placements_do_not_depend_on_its_device_order() -> None:
    """Nodes in the same state share their placements (kept across generations), and the
    first of equally cheap placements is taken: so they are listed in device key order,
    not in the order of the node that was asked first, else a decision would depend on
    which node the caches met first."""
    import dataclasses

    cluster = cluster_with(("a", 3))
    assert place(cluster, share("first", 30)) is not None
    assert place(cluster, share("second", 60)) is not None
    state = cluster.nodes["a"]
    view = state.views["nvidia"]
    reversed_view = dataclasses.replace(view, devices=list(reversed(view.devices)))

    class Twin:
        name = "twin"
        views = {"nvidia": reversed_view}
        devices = state.devices
        utilisation = state.utilisation

    request = parse_pod(share("p", 10), [NVIDIA])
    assert request is not None
    (item,) = request.containers[0]
    policy = cluster.defrag
    devices_now = policy.node_key(state)[0]
    listed = policy._placements(state, request, "binpack", item, devices_now)
    twin = policy._placements(Twin(), request, "binpack", item, devices_now)
    assert listed is not None and len(listed) == 3
    assert listed == twin
    assert [p[0] for p in listed] == sorted(p[0] for p in listed if p[0] is not None)


def test_prefill_fills_the_rows_a_change_of_weights_left_stale() -> None:
    """After a change of weights every node's row is stale; the scheduler fills them
    ahead while idle (``Cluster.prefill_defrag``, a slice at a time), so the next
    decision fills none on the request path, and its costs are those a policy with
    nothing cached works out."""
    cluster = cluster_with(*((f"n{i}", 2) for i in range(6)))
    for i in range(6):
        cluster.set_node_room(f"n{i}", 4000 << i, 8192 << i)
    for cores in (20, 50):
        cluster.defrag.shapes.observe(defrag.Shape("nvidia", 1, cores, 0, cores, (), (), 500, 1024))
    cluster.defrag.shapes.force_reweigh()
    assert place(cluster, share("first", 30), (1000, 2048)) is not None
    request = parse_pod(share("p", 20), [NVIDIA])
    assert request is not None
    cluster.weigh(request, None, (1000, 2048), observe=False)  # weighed lately: remembered
    assert cluster.prefill_defrag(100) is False  # nothing stale
    generation = cluster.defrag.shapes.generation
    cluster.defrag.shapes.observe(defrag.Shape("nvidia", 1, 70, 0, 70, (), (), 2000, 4096))
    cluster.defrag.shapes.force_reweigh()
    assert cluster.defrag.shapes.generation != generation
    assert cluster.prefill_defrag(4) is True  # 6 nodes, 2 requests weighed: rows left
    while cluster.prefill_defrag(4):
        pass
    filled = cluster.defrag.filled
    free_by_model = dict(cluster.defrag.free_by_model)
    costs = cluster.weigh(request, None, (1000, 2048), observe=False)
    assert cluster.defrag.filled == filled  # every row was there already
    assert costs == uncached_costs(cluster, request, (1000, 2048), free_by_model)
    assert cluster.prefill_defrag(100) is False


def test_prefill_never_starts_the_caches_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Near the answers' bound the background fill stops rather than push them past it
    (which would start every cache over, and the fill again, in a loop)."""
    from hami.core import defragpolicy

    cluster = cluster_with(*((f"n{i}", i + 1) for i in range(6)))  # six node states
    request = parse_pod(share("p", 20), [NVIDIA])
    assert request is not None
    cluster.weigh(request, None, (1000, 2048), observe=False)
    cluster.defrag.shapes.observe(defrag.Shape("nvidia", 1, 70, 0, 70, (), (), 2000, 4096))
    cluster.defrag.shapes.force_reweigh()
    monkeypatch.setattr(defragpolicy, "MAX_ANSWERS", 4)
    epochs = set()
    for _ in range(10):  # one row a slice, as the role's task does 64
        cluster.prefill_defrag(1)
        epochs.add(cluster.defrag._epoch)
    assert len(epochs) == 1  # one new generation for the new weights, no restart
    assert sum(len(a) for a in cluster.defrag._answers.values()) == 3  # stopped past 4 // 2
