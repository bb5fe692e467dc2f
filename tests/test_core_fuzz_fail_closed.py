"""Fuzz what the scheduler does with decisions that stop being readable (issue 18 item 3).

Hypothesis runs the scheduler's own loop over two nodes: pods are placed by ``decide`` and
their decisions written as the scheduler writes them; then a decision's value is corrupted
into one that does not decode (after a readable one, or before the scheduler ever read
one), fixed, the pod finished or deleted, handshake passes run, and new pods keep being
placed. What each pod really got is the decision it was placed with (what kubelet's
Allocate handed out). After every step:

- no device is counted below what its pods really got (an unreadable value never frees
  room), so the placements never add up to more than a device has: no 60,500 MiB on a
  40,960 MiB device;
- counted usage equals the sum of the counted records, and nothing is negative;
- once every pod is gone, every device is free again (no hold outlives its pod).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from _core_helpers import NOW, NVIDIA, gpu, node, pod, register
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core.cluster import Cluster
from hami.core.requests import parse_pod
from hami.core.usage import Use
from hami.protocol import ProtocolError, decode_pod_devices, encode_pod_devices

ALLOCATED = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
# No id is a prefix of another: a truncated id never names a different device.
NODES = {"a": ("GPU-0a", "GPU-1b", "GPU-2c"), "b": ("GPU-3d", "GPU-4e")}
MEMORY = 40960
SPLIT = 4


@dataclass
class Placed:
    name: str
    node: str
    value: str  # the decision as written
    truth: dict[str, Use]  # what the pod got, per device
    shown: str  # the value on the pod now


requests = st.tuples(
    st.integers(1, 2),  # devices
    st.sampled_from([1000, 8000, 20000, 30000, 40500, MEMORY]),
    st.sampled_from([0, 0, 30, 100]),  # cores (100: exclusive)
)
# Without the ids' letters: junk never names a registered device.
junk = st.text(alphabet=st.sampled_from(list("GPU-,:;0123456789xyzO ")), max_size=30)


@st.composite
def corruptions(draw: st.DrawFn) -> tuple[str, int, str]:
    how = draw(st.sampled_from(["truncate", "insert", "field", "replace"]))
    return how, draw(st.integers(0, 10_000)), draw(junk)


def corrupt(value: str, how: str, at: int, text: str) -> str | None:
    """A variant of ``value`` that does not decode, or None when this one would."""
    if how == "truncate":
        out = value[: 1 + at % len(value)]
    elif how == "insert":
        position = at % (len(value) + 1)
        out = value[:position] + (text or "x") + value[position:]
    elif how == "field":
        fields = value.split(",")
        index = 2 + (at % 2)  # memory or cores of the first device
        fields[index] = (text or "x") + fields[index][:1]
        out = ",".join(fields)
    else:
        out = text
    if not out:
        return None  # an empty value is an absent one, not an unreadable one
    try:
        decode_pod_devices(out)
    except ProtocolError:
        return out
    return None


steps = st.lists(
    st.one_of(
        st.tuples(st.just("place"), requests),
        st.tuples(st.just("place-unread"), requests, corruptions()),
        st.tuples(st.just("corrupt"), st.integers(0, 50), corruptions()),
        st.tuples(st.just("fix"), st.integers(0, 50)),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("delete"), st.integers(0, 50)),
        st.tuples(st.just("pass"), st.integers(0, 600)),
        st.tuples(st.just("to-allocate"), st.integers(0, 50), junk),
    ),
    max_size=25,
)


def pod_object(p: Placed, value: str, *, phase: str = "Running", **extra: str) -> dict[str, Any]:
    return pod(
        gpu(),
        name=p.name,
        uid=f"uid-{p.name}",
        node_name=p.node,
        phase=phase,
        annotations={
            "hami.io/vgpu-node": p.node,
            ALLOCATED: value,
            TO_ALLOCATE: ";",
            "hami.io/bind-phase": "success",
            **extra,
        },
    )


def check(c: Cluster, placed: list[Placed]) -> None:
    truth: dict[str, Use] = {}
    for p in placed:
        for uuid, use in p.truth.items():
            truth.setdefault(uuid, Use()).add(use)
    for name, uuids in NODES.items():
        for uuid in uuids:
            device = c.nodes[name].devices[uuid]
            got = truth.get(uuid, Use())
            # what was handed out fits the device...
            assert got.memory <= device.total_memory and got.slots <= device.count
            assert got.cores <= 100
            # ...because the scheduler never counts less than that
            assert device.used_memory >= got.memory, (uuid, device, got)
            assert device.used >= got.slots and device.used_cores >= got.cores
            assert device.free_memory >= 0 and device.free_cores >= 0
    rebuilt: dict[str, dict[str, Use]] = {}
    for record in c.pods.values():
        for uuid, use in record.usage.items():
            rebuilt.setdefault(record.node, {}).setdefault(uuid, Use()).add(use)
    expected = {
        n: {u: (x.slots, x.memory, x.cores) for u, x in sorted(per.items()) if not x.is_zero()}
        for n, per in sorted(rebuilt.items())
    }
    assert c.usage_snapshot() == {n: per for n, per in expected.items() if per}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_unreadable_decisions_never_let_placements_exceed_a_device(
    steps: list[tuple[Any, ...]],
) -> None:
    c = Cluster([NVIDIA], handshake_timeout=timedelta(seconds=60))
    for name, uuids in NODES.items():
        c.upsert_node(node(name, register(list(uuids), memory=MEMORY, count=SPLIT)), NOW)
    c.refresh(NOW)
    placed: list[Placed] = []
    now = NOW
    for number, step in enumerate(steps):
        op = step[0]
        if op in ("place", "place-unread"):
            count, memory, cores = step[1]
            request = parse_pod(pod(gpu(count=count, mem=memory, cores=cores)), [NVIDIA])
            assert request is not None
            decision = c.decide(request)
            if decision.node is None:
                continue
            assert decision.fit is not None
            value = encode_pod_devices(decision.fit.assignment["nvidia"])
            p = Placed(f"p{number}", decision.node, value, dict(decision.fit.usage), value)
            if op == "place-unread":
                p.shown = corrupt(value, *step[2]) or value
            placed.append(p)
            c.upsert_pod(pod_object(p, p.shown), now)
        elif not placed:
            continue
        elif op == "pass":
            now += timedelta(seconds=step[1])
            c.refresh(now)
        else:
            p = placed[step[1] % len(placed)]
            if op == "corrupt":
                bad = corrupt(p.value, *step[2])
                if bad is not None:
                    p.shown = bad
                    assert c.upsert_pod(pod_object(p, bad), now)
            elif op == "fix":
                p.shown = p.value
                assert c.upsert_pod(pod_object(p, p.value), now) == []
            elif op == "to-allocate":
                # another annotation changes (junk too); the decision value stays
                c.upsert_pod(pod_object(p, p.shown, **{TO_ALLOCATE: step[2]}), now)
            elif op == "finish":
                c.upsert_pod(pod_object(p, p.value, phase="Succeeded"), now)
                placed.remove(p)
            else:
                c.delete_pod(f"default/{p.name}")
                placed.remove(p)
        check(c, placed)
    for p in placed:
        c.delete_pod(f"default/{p.name}")
    assert c.usage_snapshot() == {}
    for name in NODES:
        assert not c.nodes[name].whole and not c.nodes[name].whole_uuids
        for device in c.nodes[name].devices.values():
            assert (device.used, device.used_memory, device.used_cores) == (0, 0, 0)
