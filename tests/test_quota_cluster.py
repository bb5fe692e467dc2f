"""Namespace device quotas in the cluster state: holds counted as Go HAMi counts them,
kept incrementally from pod records, checked in every decision. Pure."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from _core_helpers import MLU, NOW, NVIDIA, gpu, node, pod, register
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.cluster import Cluster
from hami.core.quota import QUOTA_EXCEEDED, least_charge
from hami.core.requests import DeviceKind, PodRequest, parse_pod
from hami.protocol import ContainerDevice, encode_pod_devices

MEM, CORES = "nvidia.com/gpumem", "nvidia.com/gpucores"


def quota(namespace: str, name: str, hard: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {"hard": hard}}


def cluster(kinds: list[DeviceKind] | None = None) -> Cluster:
    return Cluster(kinds or [NVIDIA], handshake_timeout=timedelta(seconds=60))


def request(p: dict[str, Any], kinds: list[DeviceKind] | None = None) -> PodRequest:
    parsed = parse_pod(p, kinds or [NVIDIA])
    assert parsed is not None
    return parsed


def place(c: Cluster, p: dict[str, Any], kinds: list[DeviceKind] | None = None) -> str | None:
    """Filter's decision and reservation for ``p``; the node reason when refused."""
    meta = p["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    decision = c.decide(request(p, kinds), namespace=meta["namespace"])
    if decision.node is None or decision.fit is None:
        return "; ".join(sorted(set(decision.failed.values())))
    c.reserve(key, meta["uid"], decision.node, decision.fit)
    return None


def one_node(c: Cluster, gpus: int = 4, memory: int = 32768) -> None:
    uuids = [f"GPU-{i}" for i in range(gpus)]
    c.upsert_node(node("n", register(uuids, memory=memory)), NOW)
    c.refresh(NOW)


def gpu_pod(name: str, *containers: dict[str, Any], ns: str = "team", **kw: Any) -> dict:
    return pod(*containers, name=name, namespace=ns, uid=f"uid-{name}", **kw)


# ---------------------------------------------------------------- counting holds


def test_memory_counts_per_device_times_count_and_cores_add_up() -> None:
    c = cluster()
    one_node(c)
    assert place(c, gpu_pod("p", gpu(count=2, mem=3000, cores=30))) is None
    assert c.quotas.used("team") == {MEM: 6000, CORES: 60}


def test_a_percentage_counts_the_mib_it_takes_on_the_device() -> None:
    c = cluster()
    one_node(c, memory=20000)
    assert place(c, gpu_pod("p", gpu(pct=25))) is None
    assert c.quotas.used("team") == {MEM: 5000}
    assert place(c, gpu_pod("whole", gpu())) is None  # no memory asked: the whole device
    assert c.quotas.used("team") == {MEM: 25000}


def test_init_containers_count_at_their_peak() -> None:
    c = cluster()
    one_node(c, gpus=1)
    p = gpu_pod("p", gpu("app", mem=2000), init=(gpu("i1", mem=8000), gpu("i2", mem=5000)))
    assert place(c, p) is None
    assert c.quotas.used("team") == {MEM: 8000}


def test_holds_follow_the_pod_records() -> None:
    c = cluster()
    one_node(c)
    devices = [[ContainerDevice("GPU-0", "NVIDIA", 3000, 20)]]
    annotations = {
        "hami.io/vgpu-node": "n",
        "hami.io/vgpu-devices-allocated": encode_pod_devices(devices),
        "hami.io/vgpu-time": str(int(NOW.timestamp())),
    }
    p = gpu_pod("p", gpu(mem=3000), annotations=annotations, node_name="n", phase="Running")
    c.upsert_pod(p, NOW)
    assert c.quotas.used("team") == {MEM: 3000, CORES: 20}
    c.upsert_pod({**p, "status": {"phase": "Succeeded"}}, NOW)  # finished: holds nothing
    assert c.quotas.used("team") == {}
    c.upsert_pod(p, NOW)
    c.delete_pod("team/p")
    assert c.quotas.used("team") == {}
    # an unbound decision whose deadline passed stops counting
    pending = gpu_pod("d", gpu(mem=3000), annotations=annotations)
    c.upsert_pod(pending, NOW)
    assert c.quotas.used("team") == {MEM: 3000, CORES: 20}
    c.expire_decisions(NOW + timedelta(minutes=5))
    assert c.quotas.used("team") == {}


def test_each_device_type_counts_against_its_own_resources() -> None:
    kinds = [NVIDIA, MLU]
    c = cluster(kinds)
    c.upsert_node(node("n", register(["GPU-0"], memory=20000)), NOW)
    mlu = register(["MLU-0"], memory=24576, model="MLU370")
    c.upsert_node(node("m", mlu, type_word="mlu"), NOW)
    c.refresh(NOW)
    mlu_container = {"name": "m", "resources": {"limits": {"cambricon.com/vmlu": "1"}}}
    both = gpu_pod("p", gpu(mem=3000), ns="team")
    assert place(c, both, kinds) is None
    assert place(c, gpu_pod("q", mlu_container), kinds) is None
    assert c.quotas.used("team") == {
        MEM: 3000,
        "cambricon.com/mlu.smlu.vmemory": 24576,
        "cambricon.com/mlu.smlu.vcore": 100,
    }


# ---------------------------------------------------------------- enforcing


def test_the_last_quota_is_taken_once_and_an_explicit_zero_blocks() -> None:
    c = cluster()
    one_node(c)
    c.quotas.upsert(quota("team", "gpu", {f"limits.{MEM}": "10000"}))
    assert place(c, gpu_pod("a", gpu(mem=6000))) is None
    # the reservation counts at once: the next decision sees it
    reason = place(c, gpu_pod("b", gpu(mem=6000)))
    assert reason == (
        f"{QUOTA_EXCEEDED}: namespace team has 6000MiB of limits.{MEM} in use and the pod "
        "needs 6000MiB more; ResourceQuota gpu allows 10000MiB"
    )
    assert place(c, gpu_pod("c", gpu(mem=4000))) is None  # exactly the limit
    assert place(c, gpu_pod("other", gpu(mem=6000), ns="elsewhere")) is None
    c.release("team/a")
    assert place(c, gpu_pod("b", gpu(mem=6000))) is None
    # an explicit 0 blocks any hold of that resource; cores 0 admits pods asking none
    c.quotas.upsert(quota("zero", "gpu", {f"limits.{MEM}": "0", f"limits.{CORES}": "0"}))
    assert (place(c, gpu_pod("z", gpu(mem=1), ns="zero")) or "").startswith(QUOTA_EXCEEDED)
    c.quotas.upsert(quota("zero", "gpu", {f"limits.{CORES}": "0"}))
    assert place(c, gpu_pod("z", gpu(mem=1), ns="zero")) is None
    refused = place(c, gpu_pod("y", gpu(mem=1, cores=5), ns="zero")) or ""
    assert refused.startswith(QUOTA_EXCEEDED)


def test_a_percentage_is_judged_per_node_by_its_devices() -> None:
    c = cluster()
    c.upsert_node(node("big", register(["GPU-b"], memory=40000)), NOW)
    c.upsert_node(node("small", register(["GPU-s"], memory=16000)), NOW)
    c.refresh(NOW)
    c.quotas.upsert(quota("team", "gpu", {f"limits.{MEM}": "10000"}))
    p = gpu_pod("p", gpu(pct=50))
    decision = c.decide(request(p), namespace="team")
    assert decision.node == "small"  # 8000 MiB there, 20000 on the big one
    reasons = c.explain(request(p), ["big", "small"], namespace="team")
    assert reasons["big"].startswith(QUOTA_EXCEEDED) and reasons["small"] == ""
    c.upsert_node(node("small", None), NOW)
    c.refresh(NOW)
    failed = c.decide(request(p), namespace="team").failed
    assert failed["big"].startswith(QUOTA_EXCEEDED)


def test_a_pod_that_cannot_fit_anywhere_is_refused_before_any_fit() -> None:
    c = cluster()
    one_node(c)
    c.quotas.upsert(quota("team", "gpu", {f"limits.{MEM}": "5000"}))
    decision = c.decide(request(gpu_pod("p", gpu(count=2, mem=3000))), namespace="team")
    assert decision.evaluated == 0
    assert decision.failed["n"].startswith(QUOTA_EXCEEDED)
    # without a namespace (callers that do not enforce quotas) nothing changes
    assert c.decide(request(gpu_pod("p", gpu(count=2, mem=3000)))).node == "n"


# ---------------------------------------------------------------- properties

Hold = tuple[str, str, int, int, int]  # namespace, pod, device, memory, cores


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "drop"]),
            st.sampled_from(["a", "b"]),
            st.sampled_from(["p0", "p1", "p2"]),
            st.integers(0, 3),
            st.integers(1, 5000),
            st.integers(0, 100),
        ),
        max_size=40,
    )
)
def test_incremental_totals_equal_a_recount(steps: list[tuple[str, str, str, int, int, int]]):
    c = cluster()
    one_node(c, gpus=4, memory=10**6)
    for action, namespace, name, device, memory, cores in steps:
        key = f"{namespace}/{name}"
        if action == "drop":
            c.delete_pod(key)
            continue
        devices = [[ContainerDevice(f"GPU-{device}", "NVIDIA", memory, cores)]]
        annotations = {
            "hami.io/vgpu-node": "n",
            "hami.io/vgpu-devices-allocated": encode_pod_devices(devices),
        }
        p = gpu_pod(name, gpu(), ns=namespace, annotations=annotations, node_name="n")
        c.upsert_pod(p, NOW)
    for namespace in ("a", "b"):
        expected: dict[str, int] = {}
        for key, record in c.pods.items():
            if key.startswith(f"{namespace}/"):
                for use in record.usage.values():
                    for name, amount in ((MEM, use.memory), (CORES, use.cores)):
                        if amount:
                            expected[name] = expected.get(name, 0) + amount
        assert c.quotas.used(namespace) == expected


containers = st.lists(
    st.tuples(
        st.integers(1, 3),  # count
        st.one_of(st.none(), st.integers(1, 9000)),  # memory
        st.one_of(st.none(), st.integers(1, 100)),  # percentage
        st.integers(0, 100),  # cores
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=80, deadline=None)
@given(containers, st.lists(containers.map(lambda c: c[0]), max_size=2))
def test_the_quick_check_never_refuses_a_pod_whose_placement_fits(
    app: list[tuple[int, int | None, int | None, int]],
    init: list[tuple[int, int | None, int | None, int]],
) -> None:
    def container(i: int, spec: tuple[int, int | None, int | None, int]) -> dict[str, Any]:
        count, mem, pct, cores = spec
        return gpu(f"c{i}", count=count, mem=mem, pct=None if mem else pct, cores=cores)

    p = gpu_pod(
        "p",
        *(container(i, s) for i, s in enumerate(app)),
        init=tuple(container(10 + i, s) for i, s in enumerate(init)),
    )
    c = cluster()
    one_node(c, gpus=4, memory=40000)
    decision = c.decide(request(p))
    if decision.fit is None:
        return
    charge = c.quotas.charge(decision.fit.usage, {})
    least = least_charge(request(p), {"nvidia": list(c.quotas.resources.values())})
    for name, amount in least.items():
        assert amount <= charge.get(name, 0)
