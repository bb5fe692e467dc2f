"""Fuzz the *uses* of parsed annotation values, not only the decoders (issue 9).

Hypothesis writes register, handshake, pod device, bind-phase, vgpu-node, vgpu-time and
node lock values, and Node capacity/allocatable, then drives the scheduler's cluster state
the way the scheduler does: upsert_node / upsert_pod -> refresh(now) -> decide / explain ->
usage_snapshot, at times that are not the stamps' times. None of these may raise, and:

- no device's counted free memory, cores or slots is negative, nor any summary;
- incremental usage equals the sum of the counted records (no hold lost or doubled);
- a garbage pod value costs only that pod: the well-formed pods' records are the same as in
  a cluster that never saw the garbage ones;
- a garbage node value costs only that node: a well-formed node stays available and takes a
  small pod whatever the others say.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from _core_helpers import NVIDIA, gpu, node, pod, register
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core.cluster import Cluster
from hami.core.requests import parse_pod
from hami.core.usage import Use

NODES = ("n0", "n1")
UUIDS = ("GPU-n0-0", "GPU-n0-1", "GPU-n1-0", "GPU-good-0")
GOOD_SHAKE = "Reported_2024-05-20 09:59:00"

junk = st.text(
    alphabet=st.sampled_from(list("GPU-,:;0123456789 .eE+-_[]{}\"'truefalsRqinDd\u00e9\u0663")),
    max_size=40,
)
ints = st.one_of(
    st.integers(-5, 200),
    st.integers(-(2**31) - 2, 2**31 + 2),
    st.sampled_from([2**63, -(2**63), 10**30]),
)
stamp_times = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)
)
# The scheduler's own clock: sane, but not the stamps' time.
clock = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1)).map(
    lambda t: t.replace(tzinfo=UTC)
)


@st.composite
def shakes(draw: st.DrawFn) -> str | None:
    word = draw(st.sampled_from(["Reported", "Requesting", "Deleted", "Other", ""]))
    layout = draw(st.sampled_from(["%Y-%m-%d %H:%M:%S", "%Y.%m.%d %H:%M:%S"]))
    when = draw(stamp_times)
    text = f"{when.year:04d}{when.strftime(layout)[len(str(when.year)) :]}"
    edge = st.sampled_from(["Requesting_9999-12-31 23:59:59", "Requesting_0001-01-01 00:00:00"])
    return draw(st.one_of(st.just(f"{word}_{text}"), edge, junk, st.none()))


@st.composite
def registers(draw: st.DrawFn, uuids: tuple[str, ...]) -> str | None:
    health = st.sampled_from(["true", "false", "x"])
    devices = [
        f"{u},{draw(ints)},{draw(ints)},{draw(ints)},M,{draw(ints)},{draw(health)}:" for u in uuids
    ]
    json = (
        f'[{{"id":"{uuids[0]}","count":{draw(ints)},"devmem":{draw(ints)},'
        f'"devcore":{draw(ints)},"health":true}}]'
    )
    return draw(st.one_of(st.just("".join(devices)), st.just(json), junk, st.none()))


@st.composite
def device_values(draw: st.DrawFn) -> str:
    entries = []
    for _ in range(draw(st.integers(0, 3))):
        devices = [
            f"{draw(st.sampled_from(UUIDS))},NVIDIA,{draw(ints)},{draw(ints)}:"
            for _ in range(draw(st.integers(0, 2)))
        ]
        entries.append("".join(devices) + ";")
    return draw(st.one_of(st.just("".join(entries)), junk))


quantities = st.one_of(
    st.sampled_from(["0", "1", "2", "-1", "1k", "0.5", "", "x", "1e3", "9" * 80]),
    st.integers(-3, 3),
    st.none(),
    st.lists(st.integers(), max_size=1),
    st.booleans(),
)


@st.composite
def statuses(draw: st.DrawFn) -> Any:
    def resources() -> Any:
        return draw(
            st.one_of(
                st.dictionaries(st.sampled_from(["nvidia.com/gpu", "cpu"]), quantities),
                st.none(),
                junk,
            )
        )

    return draw(
        st.one_of(
            st.fixed_dictionaries(
                {"capacity": st.just(resources()), "allocatable": st.just(resources())}
            ),
            st.none(),
            junk,
        )
    )


@st.composite
def pod_annotations(draw: st.DrawFn) -> dict[str, str]:
    values = {
        "hami.io/vgpu-node": st.one_of(st.sampled_from(NODES), junk),
        "hami.io/vgpu-devices-allocated": device_values(),
        "hami.io/bind-phase": st.one_of(st.sampled_from(["allocating", "success", "failed"]), junk),
        "hami.io/vgpu-time": st.one_of(ints.map(str), junk, st.just("9" * 5000)),
    }
    out: dict[str, str] = {}
    for key, strategy in values.items():
        if draw(st.booleans()) or key == "hami.io/vgpu-node":
            out[key] = draw(strategy)
    return out


def good_pod(name: str, bound: bool) -> dict[str, Any]:
    return pod(
        gpu(),
        name=name,
        uid=f"uid-{name}",
        node_name="n0" if bound else None,
        phase="Running" if bound else "Pending",
        annotations={
            "hami.io/vgpu-node": "n0",
            "hami.io/vgpu-devices-allocated": "GPU-n0-0,NVIDIA,1000,10:;",
            "hami.io/bind-phase": "success" if bound else "allocating",
        },
    )


def fuzzed_pod(name: str, annotations: dict[str, str], bound: bool) -> dict[str, Any]:
    target = annotations.get("hami.io/vgpu-node", "")
    return pod(
        gpu(),
        name=name,
        uid=f"uid-{name}",
        node_name=target if bound else None,
        phase="Running" if bound else "Pending",
        annotations=annotations,
    )


def good_node() -> dict[str, Any]:
    obj = node("good", register(["GPU-good-0"], memory=40000), shake=GOOD_SHAKE)
    obj["status"] = {"capacity": {"nvidia.com/gpu": "1"}, "allocatable": {"nvidia.com/gpu": "1"}}
    return obj


def check_invariants(c: Cluster) -> None:
    for state in c.nodes.values():
        for device in state.devices.values():
            assert device.free_memory >= 0 and device.free_cores >= 0
            assert device.used >= 0 and device.used_memory >= 0 and device.used_cores >= 0
        for t in state.types.values():
            assert 0 <= t.idle_devices <= t.free_devices <= len(t.devices)
            assert t.max_free_memory >= 0 and t.max_free_cores >= 0
    # incremental usage == the sum of the records that count
    rebuilt: dict[str, dict[str, Use]] = {}
    for record in c.pods.values():
        for uuid, use in record.usage.items():
            rebuilt.setdefault(record.node, {}).setdefault(uuid, Use()).add(use)
    expected = {
        n: {u: (x.slots, x.memory, x.cores) for u, x in sorted(per.items()) if not x.is_zero()}
        for n, per in sorted(rebuilt.items())
    }
    assert c.usage_snapshot() == {n: per for n, per in expected.items() if per}
    assert not set(c.pods) & set(c.lapsed)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.tuples(
        *(
            st.tuples(registers((f"GPU-{n}-0", f"GPU-{n}-1")), shakes(), statuses(), junk)
            for n in NODES
        )
    ),
    pods=st.lists(st.tuples(pod_annotations(), st.booleans()), max_size=4),
    now=clock,
    later=st.integers(0, 10**6),
    pass_now=st.booleans(),
)
def test_garbage_annotations_cost_only_their_own_object(
    nodes: tuple[tuple[Any, ...], ...],
    pods: list[tuple[dict[str, str], bool]],
    now: datetime,
    later: int,
    pass_now: bool,
) -> None:
    c = Cluster([NVIDIA])
    clean = Cluster([NVIDIA])  # the same cluster without the garbage pods
    for cl in (c, clean):
        cl.upsert_node(good_node(), now)
    for name, (value, shake, status, lock) in zip(NODES, nodes, strict=True):
        obj = node(name, value, shake=shake, extra={"hami.io/mutex.lock": lock})
        obj["status"] = status
        for cl in (c, clean):
            cl.upsert_node(obj, now)
    good = [good_pod("good-bound", True), good_pod("good-pending", False)]
    for p in good:
        c.upsert_pod(p, now if pass_now else None)
        clean.upsert_pod(p, now if pass_now else None)
    for i, (values, bound) in enumerate(pods):
        c.upsert_pod(fuzzed_pod(f"f{i}", values, bound), now if pass_now else None)
    check_invariants(c)
    request = parse_pod(pod(gpu(mem=100)), [NVIDIA])
    assert request is not None
    for when in (now, now + timedelta(seconds=later)):
        for cl in (c, clean):
            cl.refresh(when)
            decision = cl.decide(request)
            assert decision.node is not None  # "good" always fits
            assert cl.decide(request, ["good"]).node == "good"
            assert cl.explain(request, ["good", *NODES, "nowhere"])["good"] == ""
            check_invariants(cl)
        for p in good:
            key = f"default/{p['metadata']['name']}"
            assert c.pods.get(key) == clean.pods.get(key)
            assert (key in c.lapsed) == (key in clean.lapsed)
    for i in range(len(pods)):
        c.delete_pod(f"default/f{i}")
    c.delete_pod("default/good-bound")
    c.delete_pod("default/good-pending")
    assert c.usage_snapshot() == {}
    assert not c.lapsed
