"""An unreadable decision fails closed (issue 18 item 3): a pod whose
``*-devices-allocated`` value cannot be decoded never frees room.

- it went bad after a readable one: the pod keeps what that one held;
- it was never readable: the devices its other annotations name (the to-allocate value,
  the id field of the bad value's pieces) are held whole, and every device of the type on
  the node when they name none or name something that is not registered there;
- the hold ends with the pod (deleted, finished) or a readable value, and the error says
  what was counted, the key and the fix.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from _core_helpers import NOW, NVIDIA, gpu, node, pod, register

from hami.core.cluster import Cluster
from hami.core.fence import bind_refusal
from hami.core.requests import PodRequest, parse_pod

KEY = "hami.io/vgpu-devices-allocated"
A100 = 40960


def cluster() -> Cluster:
    return Cluster([NVIDIA], handshake_timeout=timedelta(seconds=60))


def request(mem: int) -> PodRequest:
    r = parse_pod(pod(gpu(mem=mem)), [NVIDIA])
    assert r is not None
    return r


def holding(
    name: str, value: str, *, bound: bool = True, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    return pod(
        gpu(),
        name=name,
        uid=f"uid-{name}",
        node_name="a" if bound else None,
        phase="Running" if bound else "Pending",
        annotations={"hami.io/vgpu-node": "a", KEY: value, **(extra or {})},
    )


def a100s(c: Cluster, count: int = 1) -> None:
    uuids = [f"GPU-a{i}" for i in range(count)]
    c.upsert_node(node("a", register(uuids, memory=A100, count=10)), NOW)
    c.refresh(NOW)


def handed_out(c: Cluster, uuid: str) -> int:
    """MiB the records that count give to containers on ``uuid``."""
    return sum(r.usage[uuid].memory for r in c.pods.values() if uuid in r.usage)


def place(c: Cluster, name: str, mem: int) -> str | None:
    """Filter and record a pod the way the scheduler does (decide, then its decision)."""
    decision = c.decide(request(mem))
    if decision.node is None:
        return None
    assert decision.fit is not None
    uuid = next(iter(decision.fit.usage))
    c.upsert_pod(holding(name, f"{uuid},NVIDIA,{mem},0:;"))
    return uuid


def test_a_value_gone_bad_keeps_its_last_readable_hold_no_60500_mib_on_a_40960_mib_device() -> None:
    c = cluster()
    a100s(c)
    assert c.upsert_pod(holding("old", "GPU-a0,NVIDIA,20000,0:;")) == []
    # A buggy writer (or another HAMi) leaves a value that does not decode.
    errors = c.upsert_pod(holding("old", "GPU-a0,NVIDIA,20000"))
    # Before: "old" held nothing, 40500 MiB went beside it, 60500 MiB on a 40960 MiB GPU.
    assert place(c, "new", 40500) is None
    assert handed_out(c, "GPU-a0") <= A100
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 20000, 0)}}
    assert len(errors) == 1
    assert errors[0].startswith(f"{KEY}: ")
    assert "counted as holding what its last readable value held (GPU-a0)" in errors[0]
    assert "until the pod is deleted or its value is fixed" in errors[0]
    assert "fix: " in errors[0]
    # What still fits beside it does.
    assert place(c, "small", 20000) == "GPU-a0"
    # The same bad value again: the same hold and the same error (logged once).
    assert c.upsert_pod(holding("old", "GPU-a0,NVIDIA,20000")) == errors
    assert c.usage_snapshot() == {"a": {"GPU-a0": (2, 40000, 0)}}
    # Fixed: its value counts again, exactly.
    assert c.upsert_pod(holding("old", "GPU-a0,NVIDIA,10000,0:;")) == []
    assert c.usage_snapshot() == {"a": {"GPU-a0": (2, 30000, 0)}}


def test_a_value_never_readable_holds_the_device_it_names_whole() -> None:
    c = cluster()
    a100s(c, 2)
    errors = c.upsert_pod(holding("bad", "GPU-a0,NVIDIA,2000O,0:;"))  # letter O
    assert len(errors) == 1
    assert "counted as holding GPU-a0 fully" in errors[0]
    assert "until the pod is deleted or its value is fixed" in errors[0]
    device = c.nodes["a"].devices["GPU-a0"]
    assert (device.free_memory, device.free_cores, device.used >= device.count) == (0, 0, True)
    assert c.nodes["a"].devices["GPU-a1"].free_memory == A100
    assert place(c, "new", 40500) == "GPU-a1"
    assert place(c, "more", 500) is None  # 40500 + 500 > 40960
    # Deleted: everything it held is free again.
    c.delete_pod("default/bad")
    assert c.nodes["a"].devices["GPU-a0"].free_memory == A100
    assert place(c, "after", 100) == "GPU-a0"


def test_ids_named_by_the_to_allocate_value_are_held_whole() -> None:
    c = cluster()
    a100s(c, 3)
    extra = {"hami.io/vgpu-devices-to-allocate": "GPU-a2,NVIDIA,1000,0:;"}
    # Only the to-allocate value names a device: that one alone.
    assert "counted as holding GPU-a2 fully" in c.upsert_pod(holding("p", ";,;", extra=extra))[0]
    held = {u for u, d in c.nodes["a"].devices.items() if d.free_memory == 0}
    assert held == {"GPU-a2"}
    # Both name one: both.
    c.upsert_pod(holding("p", "GPU-a1,NVIDIA,x:;", extra=extra))
    held = {u for u, d in c.nodes["a"].devices.items() if d.free_memory == 0}
    assert held == {"GPU-a1", "GPU-a2"}
    # "garbage" is no registered device: which one the pod holds is unknown, so all.
    errors = c.upsert_pod(holding("p", "garbage,x;", extra=extra))
    assert "counted as holding GPU-a2, garbage fully (every nvidia device of node a" in errors[0]
    assert all(d.free_memory == 0 for d in c.nodes["a"].devices.values())


def test_partial_names_are_not_trusted_the_whole_type_is_held() -> None:
    c = cluster()
    a100s(c, 3)
    # Cut short: the pod had GPU-a0 and GPU-a1, only the first id is left (the fuzz test
    # found this): holding GPU-a0 alone would free GPU-a1.
    errors = c.upsert_pod(holding("cut", "GPU-a0,NVIDIA,1000,0:GPU-a1,NVI"))
    assert "counted as holding every nvidia device of node a fully" in errors[0]
    assert all(d.free_memory == 0 for d in c.nodes["a"].devices.values())
    c.delete_pod("default/cut")
    # The to-allocate value after the first container's Allocate erased its entry: it names
    # the second container's device only, so it does not say what the pod holds.
    two = pod(
        gpu("c0"),
        gpu("c1"),
        name="two",
        uid="uid-two",
        node_name="a",
        phase="Pending",
        annotations={
            "hami.io/vgpu-node": "a",
            KEY: "junk",
            "hami.io/vgpu-devices-to-allocate": ";GPU-a2,NVIDIA,1000,0:;",
        },
    )
    assert "every nvidia device of node a" in c.upsert_pod(two)[0]
    assert all(d.free_memory == 0 for d in c.nodes["a"].devices.values())
    # Before any Allocate both entries are there: exactly those devices.
    two["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] = (
        "GPU-a0,NVIDIA,1000,0:;GPU-a2,NVIDIA,1000,0:;"
    )
    assert "counted as holding GPU-a0, GPU-a2 fully" in c.upsert_pod(two)[0]
    held = {u for u, d in c.nodes["a"].devices.items() if d.free_memory == 0}
    assert held == {"GPU-a0", "GPU-a2"}


def test_a_value_naming_nothing_holds_every_device_of_the_type_on_its_node() -> None:
    c = cluster()
    a100s(c, 2)
    c.upsert_node(node("b", register(["GPU-b0"], memory=A100, count=10)), NOW)
    errors = c.upsert_pod(holding("bad", ";;,"))
    assert "counted as holding every nvidia device of node a fully" in errors[0]
    assert all(d.free_memory == 0 for d in c.nodes["a"].devices.values())
    assert c.nodes["b"].devices["GPU-b0"].free_memory == A100
    assert c.decide(request(100)).node == "b"


def test_the_hold_follows_the_node_registering_later_and_ends_with_the_pod() -> None:
    c = cluster()
    errors = c.upsert_pod(holding("bad", "GPU-a1,NVIDIA,x,0:;"))  # listed before its node
    assert errors
    a100s(c, 2)
    assert c.nodes["a"].devices["GPU-a1"].free_memory == 0
    assert c.nodes["a"].devices["GPU-a0"].free_memory == A100
    # the node re-registers without GPU-a1: the claim names no device there, all are held
    c.upsert_node(node("a", register(["GPU-a0"], memory=A100, count=10), rv="2"), NOW)
    assert c.nodes["a"].devices["GPU-a0"].free_memory == 0
    # finished: it holds nothing
    done = holding("bad", "GPU-a1,NVIDIA,x,0:;")
    done["status"]["phase"] = "Succeeded"
    assert c.upsert_pod(done) == []
    assert c.nodes["a"].devices["GPU-a0"].free_memory == A100
    assert "a" in c.nodes and not c.nodes["a"].whole


def test_a_pod_bound_without_vgpu_node_holds_on_its_bound_node() -> None:
    c = cluster()
    a100s(c)
    obj = holding("bad", "junk")
    del obj["metadata"]["annotations"]["hami.io/vgpu-node"]
    assert "every nvidia device of node a" in c.upsert_pod(obj)[0]
    assert c.nodes["a"].devices["GPU-a0"].free_memory == 0


def test_an_unreadable_unbound_decision_still_lapses_at_its_deadline() -> None:
    c = cluster()
    a100s(c)
    obj = holding("pending", "junk", bound=False)
    obj["metadata"]["annotations"]["hami.io/vgpu-time"] = str(int(NOW.timestamp()))
    errors = c.upsert_pod(obj, NOW)
    assert "unbound decision" in errors[0]
    assert c.nodes["a"].devices["GPU-a0"].free_memory == 0
    c.refresh(NOW + timedelta(seconds=91))
    assert "default/pending" in c.lapsed
    assert c.nodes["a"].devices["GPU-a0"].free_memory == A100
    # bound after all: it holds again
    bound = holding("pending", "junk")
    c.upsert_pod(bound)
    assert c.nodes["a"].devices["GPU-a0"].free_memory == 0


def test_a_deleted_node_keeps_the_claim_for_its_return() -> None:
    c = cluster()
    a100s(c)
    c.upsert_pod(holding("bad", "junk"))
    c.delete_node("a")
    assert c.nodes["a"].whole and not c.nodes["a"].whole_uuids
    a100s(c)
    assert c.nodes["a"].devices["GPU-a0"].free_memory == 0
    c.delete_pod("default/bad")
    assert not c.nodes["a"].whole and c.nodes["a"].devices["GPU-a0"].free_memory == A100


def test_the_bind_fence_refuses_a_device_held_whole_since_filter() -> None:
    c = cluster()
    a100s(c)
    decision = c.decide(request(1000))
    assert decision.node == "a" and decision.fit is not None
    c.reserve("default/p", "uid-p", "a", decision.fit)
    mine = c.pods["default/p"]
    assert bind_refusal(c, "default/p", mine) is None
    c.upsert_pod(holding("bad", "junk"))  # shows up between filter and bind
    reason = bind_refusal(c, "default/p", mine)
    assert reason is not None and "held whole" in reason


def test_a_whole_hold_on_one_node_is_that_nodes_alone() -> None:
    """Nodes share one empty mapping of whole holds until they have one (memory at
    65,000 nodes): a hold on one must not show up on another."""
    c = cluster()
    a100s(c)
    c.upsert_node(node("b", register(["GPU-b0"], memory=A100, count=10)), NOW)
    c.refresh(NOW)
    c.upsert_pod(holding("bad", "GPU-a0,NVIDIA,oops,0:;"))
    assert c.nodes["a"].whole and "GPU-a0" in c.nodes["a"].whole_uuids
    assert not c.nodes["b"].whole and not c.nodes["b"].whole_uuids
    decision = c.decide(request(1000))
    assert decision.node == "b"
    c.delete_pod("default/bad")
    assert not c.nodes["a"].whole and not c.nodes["a"].whole_uuids
