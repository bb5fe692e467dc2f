"""Issue 9: absurd times, negative numbers, lapsed decisions and kubelet's allocatable.

Each test here pins one failure that was reproduced on a real cluster; the core is pure, so
they are plain unit tests with the time passed in.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _core_helpers import NOW, NVIDIA, gpu, node, pod, register

from hami.core.cluster import Cluster
from hami.core.requests import parse_pod
from hami.protocol import ProtocolError, decode_pod_devices, encode_pod_devices, handshake
from hami.protocol.poddevices import ContainerDevice
from hami.protocol.stamps import parse_unix_seconds

TIMEOUT = timedelta(seconds=60)
FAR = "Requesting_9999-12-31 23:59:59"


def cluster(**kwargs: Any) -> Cluster:
    return Cluster([NVIDIA], handshake_timeout=TIMEOUT, **kwargs)


def request(mem: int = 1000, cores: int | None = None) -> Any:
    parsed = parse_pod(pod(gpu(mem=mem, cores=cores)), [NVIDIA])
    assert parsed is not None
    return parsed


# ------------------------------------------------------------------ item 2: far-off times


@pytest.mark.parametrize(
    "value",
    [FAR, "Requesting_9999.12.31 23:59:59", "Requesting_2024-05-20 10:05:00"],
)
def test_a_stamp_far_in_the_future_is_treated_like_an_unparsable_one(value: str) -> None:
    decision = handshake.decide(value, has_register=True, now=NOW, timeout=TIMEOUT)
    assert decision == handshake.HandshakeDecision(True, handshake.requesting(NOW), None)


def test_a_stamp_slightly_ahead_is_left_alone() -> None:
    ahead = handshake.requesting(NOW + timedelta(seconds=30))
    decision = handshake.decide(ahead, has_register=True, now=NOW, timeout=TIMEOUT)
    assert decision == handshake.HandshakeDecision(True, None, None)


def test_a_very_old_stamp_is_a_timeout_not_an_error() -> None:
    decision = handshake.decide(
        "Requesting_0001-01-01 00:00:00", has_register=True, now=NOW, timeout=TIMEOUT
    )
    assert decision == handshake.HandshakeDecision(False, None, handshake.HANDSHAKE_TIMED_OUT)


def test_near_the_end_of_time_the_decision_is_total() -> None:
    end = datetime(9999, 12, 31, 23, 59, 30, tzinfo=UTC)
    for value in (FAR, "Requesting_0001-01-01 00:00:00", "Reported_x", None):
        handshake.decide(value, has_register=True, now=end, timeout=timedelta(days=9999))


def test_a_far_off_stamp_does_not_stop_the_pass_for_other_nodes() -> None:
    c = cluster()
    c.upsert_node(node("a", register(["GPU-a0"]), shake=FAR), NOW)
    dead = handshake.requesting(NOW - timedelta(seconds=120))
    c.upsert_node(node("b", register(["GPU-b0"]), shake=dead), NOW)
    writes, _changes = c.refresh(NOW)
    assert [(w.node, dict(w.annotations)) for w in writes] == [
        ("a", {"hami.io/node-handshake-nvidia": handshake.requesting(NOW)})
    ]
    assert c.nodes["a"].types["nvidia"].available
    assert not c.nodes["b"].types["nvidia"].available
    assert c.nodes["b"].types["nvidia"].reason == handshake.HANDSHAKE_TIMED_OUT


def test_one_node_that_breaks_the_pass_costs_only_that_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = cluster()
    c.upsert_node(node("a", register(["GPU-a0"]), shake="Reported_boom"), NOW)
    c.upsert_node(node("b", register(["GPU-b0"]), shake="Reported_fine"), NOW)
    real = handshake.decide

    def decide(value: str | None, **kwargs: Any) -> handshake.HandshakeDecision:
        if value == "Reported_boom":
            raise RuntimeError("boom")
        return real(value, **kwargs)

    monkeypatch.setattr(handshake, "decide", decide)
    writes, changes = c.refresh(NOW)
    assert [w.node for w in writes] == ["b"]
    state = c.nodes["a"].types["nvidia"]
    assert not state.available
    assert state.reason is not None and "boom" in state.reason
    assert [(ch.node, ch.available) for ch in changes] == [("a", False)]
    assert c.decide(request()).node == "b"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1716199325", datetime(2024, 5, 20, 10, 2, 5, tzinfo=UTC)),
        (" 1716199325 ", datetime(2024, 5, 20, 10, 2, 5, tzinfo=UTC)),
        ("0", datetime(1970, 1, 1, tzinfo=UTC)),
        ("253402300799", datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
    ],
)
def test_unix_seconds_parse(text: str, expected: datetime) -> None:
    assert parse_unix_seconds(text) == expected


@pytest.mark.parametrize(
    "text",
    [None, "", "-1", "+5", "1.5", "x", "253402300800", "9" * 5000, "\uff11\uff12", "1e9"],
)
def test_unix_seconds_that_are_not_a_time_are_none(text: str | None) -> None:
    assert parse_unix_seconds(text) is None


# ------------------------------------------------------------------ item 3: negative numbers


@pytest.mark.parametrize(
    "value",
    [
        "GPU-x,NVIDIA,-20000,0:;",
        "GPU-x,NVIDIA,1000,-1:;",
        "GPU-x,NVIDIA,1000,101:;",
        "GPU-x,NVIDIA,-2147483648,-1:;",
    ],
)
def test_negative_memory_or_cores_out_of_range_are_rejected(value: str) -> None:
    with pytest.raises(ProtocolError):
        decode_pod_devices(value)


@pytest.mark.parametrize(("memory", "cores"), [(-1, 0), (0, -1), (0, 101)])
def test_the_encoder_refuses_what_the_decoder_rejects(memory: int, cores: int) -> None:
    with pytest.raises(ProtocolError):
        encode_pod_devices([[ContainerDevice("GPU-x", "NVIDIA", memory, cores)]])


def holding(name: str, value: str, *, bound: bool = True) -> dict[str, Any]:
    return pod(
        gpu(),
        name=name,
        uid=f"uid-{name}",
        node_name="a" if bound else None,
        phase="Running" if bound else "Pending",
        annotations={"hami.io/vgpu-node": "a", "hami.io/vgpu-devices-allocated": value},
    )


def test_a_negative_decision_never_adds_room_to_a_device() -> None:
    c = cluster()
    c.upsert_node(node("a", register(["GPU-a0"], memory=40960, count=10)), NOW)
    assert c.upsert_pod(holding("full", "GPU-a0,NVIDIA,40960,0:;")) == []
    errors = c.upsert_pod(holding("neg", "GPU-a0,NVIDIA,-20000,0:;"))
    assert len(errors) == 1 and "memory" in errors[0]
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 40960, 0)}}
    decision = c.decide(request(mem=20000))
    assert decision.node is None
    # the rejected value names GPU-a0, so the pod holds it whole (an unreadable decision
    # fails closed): full, never room added
    assert decision.failed["a"] == "1/1 CardTimeSlicingExhausted"


def test_an_over_committed_device_is_full_not_negative_room() -> None:
    c = cluster()
    c.upsert_node(node("a", register(["GPU-a0", "GPU-a1"], memory=40960)), NOW)
    c.upsert_pod(holding("p1", "GPU-a0,NVIDIA,30000,80:;"))
    c.upsert_pod(holding("p2", "GPU-a0,NVIDIA,30000,80:;"))
    device = c.nodes["a"].devices["GPU-a0"]
    assert (device.free_memory, device.free_cores) == (0, 0)
    state = c.nodes["a"].types["nvidia"]
    assert state.max_free_memory == 40960  # GPU-a1 only
    assert state.free_devices == 1
    decision = c.decide(request(mem=100, cores=10))
    assert decision.fit is not None
    assert list(decision.fit.usage) == ["GPU-a1"]


@pytest.mark.parametrize(
    "value",
    [
        "GPU-a,-10,32768,100,m,0,true:",
        "GPU-a,10,-1,100,m,0,true:",
        "GPU-a,10,32768,-100,m,0,true:",
        '[{"id":"GPU-a","count":10,"devmem":-1,"devcore":100,"health":true}]',
    ],
)
def test_a_negative_register_value_costs_only_that_node(value: str) -> None:
    c = cluster()
    errors, _ = c.upsert_node(node("bad", value), NOW)
    assert len(errors) == 1 and "negative" in errors[0]
    c.upsert_node(node("good", register(["GPU-g0"])), NOW)
    c.refresh(NOW)
    decision = c.decide(request())
    assert decision.node == "good"
    assert "negative" in c.explain(request(), ["bad"])["bad"]


# ------------------------------------------------------------------ item 6: kubelet's word


def with_status(obj: dict[str, Any], capacity: Any, allocatable: Any) -> dict[str, Any]:
    obj["status"] = {"capacity": capacity, "allocatable": allocatable}
    return obj


def kubelet_node(allocatable: Any, capacity: Any = "4", **kwargs: Any) -> dict[str, Any]:
    base = {"cpu": "8", "pods": "110"}
    cap = {**base, "nvidia.com/gpu": capacity} if capacity is not None else base
    alloc = {**base, "nvidia.com/gpu": allocatable} if allocatable is not None else base
    return with_status(node("a", register(["GPU-a0"]), **kwargs), cap, alloc)


@pytest.mark.parametrize("allocatable", ["0", None, "-1", 0])
def test_a_type_kubelet_no_longer_allocates_is_unavailable(allocatable: Any) -> None:
    c = cluster()
    _errors, changes = c.upsert_node(kubelet_node(allocatable), NOW)
    assert changes == []  # never was available
    state = c.nodes["a"].types["nvidia"]
    assert not state.available
    assert state.reason is not None and "nvidia.com/gpu" in state.reason
    c.refresh(NOW)
    assert not c.nodes["a"].types["nvidia"].available
    decision = c.decide(request())
    assert decision.node is None
    assert "nvidia.com/gpu" in decision.failed["a"]


def test_kubelet_dropping_the_resource_turns_the_type_off_and_back_on() -> None:
    c = cluster()
    c.upsert_node(kubelet_node("4"), NOW)
    assert c.decide(request()).node == "a"
    _errors, changes = c.upsert_node(kubelet_node("0"), NOW)
    assert [(ch.node, ch.type_word, ch.available) for ch in changes] == [("a", "nvidia", False)]
    assert changes[0].reason is not None and "nvidia.com/gpu" in changes[0].reason
    assert c.decide(request()).node is None
    _errors, changes = c.upsert_node(kubelet_node("4"), NOW)
    assert [(ch.node, ch.available) for ch in changes] == [("a", True)]
    assert c.decide(request()).node == "a"


@pytest.mark.parametrize(
    ("capacity", "allocatable"),
    [(None, None), (None, "0"), ("4", "4"), ("4", "2"), ("4", "1k"), ("4", "rubbish")],
)
def test_kubelet_allocatable_that_does_not_say_no_changes_nothing(
    capacity: Any, allocatable: Any
) -> None:
    c = cluster()
    c.upsert_node(kubelet_node(allocatable, capacity=capacity), NOW)
    assert c.nodes["a"].types["nvidia"].available


@pytest.mark.parametrize(
    "status",
    [None, "x", [], {"capacity": "x", "allocatable": 5}, {"capacity": {"nvidia.com/gpu": []}}],
)
def test_a_garbage_node_status_is_not_an_error(status: Any) -> None:
    c = cluster()
    obj = node("a", register(["GPU-a0"]))
    obj["status"] = status
    c.upsert_node(obj, NOW)
    c.refresh(NOW)
    assert c.nodes["a"].types["nvidia"].available


# ------------------------------------------------------------------ item 5: lapsed decisions

DEADLINE = timedelta(seconds=90)


def decided(
    name: str,
    *,
    stamp: datetime | str | None = NOW,
    bound: bool = False,
    bind_phase: str | None = None,
    memory: int = 8000,
    uuid: str = "GPU-a0",
) -> dict[str, Any]:
    """A pod with the scheduler's decision on node a; unbound unless ``bound``."""
    annotations = {
        "hami.io/vgpu-node": "a",
        "hami.io/vgpu-devices-allocated": f"{uuid},NVIDIA,{memory},0:;",
        "hami.io/vgpu-devices-to-allocate": f"{uuid},NVIDIA,{memory},0:;",
    }
    if isinstance(stamp, datetime):
        annotations["hami.io/vgpu-time"] = str(int(stamp.timestamp()))
    elif stamp is not None:
        annotations["hami.io/vgpu-time"] = stamp
    if bind_phase is not None:
        annotations["hami.io/bind-phase"] = bind_phase
    return pod(
        gpu(),
        name=name,
        uid=f"uid-{name}",
        node_name="a" if bound else None,
        phase="Running" if bound else "Pending",
        annotations=annotations,
    )


def one_gpu() -> Cluster:
    c = cluster(decision_timeout=DEADLINE)
    c.upsert_node(node("a", register(["GPU-a0"], memory=10000)), NOW)
    return c


def test_an_unbound_decision_stops_counting_after_its_deadline() -> None:
    c = one_gpu()
    c.upsert_pod(decided("stuck", bind_phase="allocating"))
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 8000, 0)}}
    c.refresh(NOW + DEADLINE)
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 8000, 0)}}  # at the deadline: still
    c.refresh(NOW + DEADLINE + timedelta(seconds=1))
    assert c.usage_snapshot() == {}
    assert "default/stuck" in c.lapsed and "default/stuck" not in c.pods
    assert c.decide(request(mem=9000)).node == "a"


def test_a_re_listed_stale_decision_never_counts() -> None:
    """After a scheduler restart the re-list brings decisions whose binds failed long ago."""
    c = one_gpu()
    later = NOW + timedelta(minutes=10)
    c.upsert_node(node("a", register(["GPU-a0"], memory=10000)), later)
    c.upsert_pod(decided("old"))
    assert c.usage_snapshot() == {}
    # ... and with the time passed in, whatever the last node event said
    c2 = one_gpu()
    c2.upsert_pod(decided("old"), later)
    assert c2.usage_snapshot() == {}


def test_a_bound_pod_counts_whatever_its_age() -> None:
    c = one_gpu()
    c.upsert_pod(decided("running", bound=True, bind_phase="success"))
    c.refresh(NOW + timedelta(days=30))
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 8000, 0)}}


def test_a_lapsed_decision_stays_lapsed_on_later_events_and_counts_once_bound() -> None:
    c = one_gpu()
    c.upsert_pod(decided("late", stamp="garbage"))
    c.refresh(NOW + DEADLINE + timedelta(seconds=1))
    assert c.usage_snapshot() == {}
    # a status update of the same pending pod: same decision, still lapsed
    c.upsert_pod(decided("late", stamp="garbage"), NOW + timedelta(minutes=3))
    assert c.usage_snapshot() == {}
    # the Binding went through after all: a bound pod always counts
    c.upsert_pod(decided("late", stamp="garbage", bound=True), NOW + timedelta(minutes=3))
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 8000, 0)}}
    assert "default/late" not in c.lapsed


@pytest.mark.parametrize("stamp", [None, "", "soon", "-5", "99999999999999", FAR])
def test_an_unreadable_or_absurd_stamp_runs_from_when_the_decision_was_seen(
    stamp: str | None,
) -> None:
    c = one_gpu()
    c.upsert_pod(decided("odd", stamp=stamp))
    c.refresh(NOW + DEADLINE)
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 8000, 0)}}
    c.refresh(NOW + DEADLINE + timedelta(seconds=1))
    assert c.usage_snapshot() == {}


def test_a_stamp_far_in_the_future_does_not_hold_a_device_for_years() -> None:
    c = one_gpu()
    c.upsert_pod(decided("future", stamp=NOW + timedelta(days=365)))
    c.refresh(NOW + DEADLINE + timedelta(seconds=1))
    assert c.usage_snapshot() == {}


def test_a_filter_reservation_is_not_dropped_while_its_bind_may_still_run() -> None:
    c = one_gpu()
    request_ = request(mem=8000)
    decision = c.decide(request_)
    assert decision.node == "a" and decision.fit is not None
    c.reserve("default/new", "uid-new", "a", decision.fit)
    # the handshake pass right after: the reservation's clock starts here at the latest
    c.refresh(NOW + timedelta(seconds=14))
    c.refresh(NOW + timedelta(seconds=14) + DEADLINE)
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 8000, 0)}}
    # a stale event of the same pod from before the filter wrote its decision (an old,
    # long-lapsed one) does not undo the fresh hold
    c.upsert_pod(decided("new", stamp=NOW - timedelta(hours=1)))
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 8000, 0)}}
    # the event with the filter's own decision confirms it
    c.upsert_pod(decided("new", stamp=NOW + timedelta(seconds=15) + DEADLINE))
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 8000, 0)}}
    assert not c.pods["default/new"].reserved


def test_a_failed_bind_is_not_usage() -> None:
    c = one_gpu()
    c.upsert_pod(decided("failed", bind_phase="failed"))
    assert c.usage_snapshot() == {}
    c.upsert_pod(decided("failed-but-bound", bind_phase="failed", bound=True))
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 8000, 0)}}


def test_the_five_over_committed_devices_case() -> None:
    """Binds failed while the API server was down; a re-list must not over-commit."""
    c = one_gpu()
    c.upsert_pod(decided("ok", bound=True, bind_phase="success", memory=6000))
    for i in range(3):
        c.upsert_pod(decided(f"lost-{i}", stamp=NOW - timedelta(minutes=5), memory=4000))
    c.refresh(NOW)
    assert c.usage_snapshot() == {"a": {"GPU-a0": (1, 6000, 0)}}
    device = c.nodes["a"].devices["GPU-a0"]
    assert device.used_memory <= device.total_memory


# ------------------------------------------------- §2 "Agents that never heartbeat"


def silent_node(allocatable: str, shake: str | None) -> dict[str, Any]:
    """A Go HAMi >= 2.8 device plugin: registers, never writes Reported."""
    obj = node("a", register(["GPU-a0"]), shake=shake)
    obj["status"] = {
        "capacity": {"nvidia.com/gpu": "1"},
        "allocatable": {"nvidia.com/gpu": allocatable},
    }
    return obj


def test_an_agent_that_never_heartbeats_stays_while_kubelet_advertises_the_type() -> None:
    c = cluster()
    c.upsert_node(silent_node("1", None), NOW)
    writes, _ = c.refresh(NOW)
    stamp = writes[0].annotations["hami.io/node-handshake-nvidia"]
    later = NOW + timedelta(minutes=5)
    c.upsert_node(silent_node("1", stamp), later)
    c.refresh(later)
    assert c.nodes["a"].types["nvidia"].available
    # kubelet drops the resource (the plugin's socket went away): off at once
    _errors, changes = c.upsert_node(silent_node("0", stamp), later)
    assert [(ch.available, "nvidia.com/gpu" in (ch.reason or "")) for ch in changes] == [
        (False, True)
    ]


def test_an_agent_that_heartbeats_keeps_the_handshake_rule_exactly() -> None:
    c = cluster()
    c.upsert_node(silent_node("1", "Reported_2024-05-20 09:59:59"), NOW)
    c.refresh(NOW)
    c.upsert_node(silent_node("1", handshake.requesting(NOW)), NOW)
    later = NOW + timedelta(seconds=61)
    c.refresh(later)
    state = c.nodes["a"].types["nvidia"]
    assert not state.available and state.reason == handshake.HANDSHAKE_TIMED_OUT
