"""Device health as DRA device taints, the pure part: the Xid rule both modes share, the
cause a device carries, the taint it gives, and how slices compare once the API server has
stamped the taint's time (hami.backends.health, hami.dra.taints, hami.dra.slices)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import pytest

from hami.backends import health
from hami.backends.base import BackendError, BackendSettings, Device
from hami.backends.fake import FakeBackend
from hami.dra import slices, taints
from hami.dra.claimasks import Toleration, Want
from hami.dra.devicepicture import Amount, DeviceView, Held, Taint
from hami.dra.whynot import blocked
from hami.node.state import DeviceState

SICK = Device("GPU-a-1", 1, "NVIDIA A100", 40960, healthy=False, unhealthy_reason="xid-79")
WELL = Device("GPU-a-0", 0, "NVIDIA A100", 40960)


def fake(**options: object) -> FakeBackend:
    devices = [{"count": 2, "model": "NVIDIA A100", "memory": 40960}]
    return FakeBackend(
        BackendSettings(options={"uuid_prefix": "GPU-f", "devices": devices, **options})
    )


@pytest.mark.parametrize("xid", sorted(health.APPLICATION_XIDS))
def test_application_xids_are_not_fatal(xid: int) -> None:
    assert not health.is_fatal(xid)


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 92, 94, 95, 119])
def test_other_xids_are_fatal_and_named(xid: int) -> None:
    assert health.is_fatal(xid)
    assert health.xid_cause(xid) == f"xid-{xid}"
    assert health.xid_of(health.xid_cause(xid)) == xid


def test_ignored_list_replaces_the_default() -> None:
    assert not health.is_fatal(79, frozenset({79}))
    assert health.is_fatal(43, frozenset({79}))


@pytest.mark.parametrize(
    ("cause", "value"),
    [
        ("xid-79", "xid-79"),
        ("nvml-unreadable", "nvml-unreadable"),
        ("", "unhealthy"),  # no cause known
        ("Xid 79 critical error", "unhealthy"),  # spaces: not a label value
        ("-xid", "unhealthy"),  # must start with an alphanumeric
        ("x" * 64, "unhealthy"),  # too long
    ],
)
def test_the_taint_value_is_always_a_label_value(cause: str, value: str) -> None:
    assert health.label_value(cause) == value


def test_health_to_taints() -> None:
    assert taints.device_taints(WELL) == []
    assert taints.device_taints(SICK) == [
        {"key": "hami.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    ]
    unknown = Device("GPU-a-2", 2, "NVIDIA A100", 40960, healthy=False)
    assert taints.device_taints(unknown)[0]["value"] == "unhealthy"
    # a healthy device carries no taint even if a stale cause is left on it
    assert taints.device_taints(Device("u", 3, "m", 1, unhealthy_reason="xid-79")) == []


def test_fake_backend_judges_xids_as_nvidia_does() -> None:
    backend = fake()
    assert not backend.inject_xid("GPU-f-0", 43)  # GPU stopped processing: an app error
    assert backend.inject_xid("GPU-f-1", 79)  # fell off the bus
    devices = asyncio.run(backend.enumerate())
    assert [(d.healthy, d.unhealthy_reason) for d in devices] == [(True, ""), (False, "xid-79")]
    backend.set_health("GPU-f-1", True)  # recovered: no cause left
    assert [d.unhealthy_reason for d in asyncio.run(backend.enumerate())] == ["", ""]
    with pytest.raises(BackendError, match="no device"):
        backend.inject_xid("GPU-f-9", 43)
    strict = fake(ignored_xids=[79])
    assert not strict.inject_xid("GPU-f-0", 79)
    with pytest.raises(BackendError, match="ignored_xids"):
        fake(ignored_xids="79")


def test_device_state_keeps_the_cause_only_while_unhealthy() -> None:
    backend = fake()
    state = DeviceState("fake", backend)
    backend.inject_xid("GPU-f-1", 94)
    state.set_enumerated(asyncio.run(backend.enumerate()))
    assert state.devices[1].unhealthy_reason == "xid-94"
    state.on_health("GPU-f-0", False)  # an event without a cause
    assert (state.devices[0].healthy, state.devices[0].unhealthy_reason) == (False, "")
    backend.set_health("GPU-f-1", True)
    state.set_enumerated(asyncio.run(backend.enumerate()))
    assert (state.devices[1].healthy, state.devices[1].unhealthy_reason) == (True, "")


def test_the_servers_time_stamp_is_no_change_and_is_kept() -> None:
    backend = fake()
    desired = slices.next_slice("node-a", backend, [WELL, SICK], None)
    assert desired is not None
    stored = copy.deepcopy(desired)
    stored["spec"]["devices"][1]["taints"][0]["timeAdded"] = "2026-12-03T22:00:00Z"
    assert slices.next_slice("node-a", backend, [WELL, SICK], stored) is None
    # another change (device 0 falls ill too): the old taint keeps its time, the new has none
    sick0 = Device("GPU-a-0", 0, "NVIDIA A100", 40960, healthy=False, unhealthy_reason="xid-48")
    changed = slices.next_slice("node-a", backend, [sick0, SICK], stored)
    assert changed is not None
    assert changed["spec"]["devices"][1]["taints"][0]["timeAdded"] == "2026-12-03T22:00:00Z"
    assert "timeAdded" not in changed["spec"]["devices"][0]["taints"][0]
    # recovery: the taint goes
    well1 = dataclasses.replace(SICK, healthy=True, unhealthy_reason="")
    healed = slices.next_slice("node-a", backend, [WELL, well1], stored)
    assert healed is not None
    assert not any("taints" in d for d in healed["spec"]["devices"])
    assert healed["spec"]["devices"][1]["attributes"]["healthy"] == {"bool": True}


def test_dropped_taints_are_seen_in_the_servers_answer() -> None:
    sent = slices.slice_spec("node-a", fake(), [WELL, SICK], 0)
    kept = {"spec": copy.deepcopy(sent)}
    assert not taints.dropped(sent, kept)
    stripped = copy.deepcopy(kept)
    for device in stripped["spec"]["devices"]:
        device.pop("taints", None)
    assert taints.dropped(sent, stripped)
    healthy_only = slices.slice_spec("node-a", fake(), [WELL], 0)
    assert not taints.dropped(healthy_only, {"spec": healthy_only})  # nothing to drop
    assert taints.dropped(sent, {})  # an answer without a spec keeps no taint either


def test_explain_says_what_hamis_taint_means() -> None:
    assert taints.describe("hami.io/unhealthy", "xid-79") == (
        "hami found it unhealthy: critical Xid 79"
    )
    assert taints.describe("hami.io/unhealthy", "nvml-unreadable") == (
        "hami found it unhealthy: nvml-unreadable"
    )
    assert taints.describe("example.com/other", "x") is None
    device = DeviceView(
        node="n",
        driver="nvidia.hami.io",
        name="nvidia-1",
        uuid="GPU-a-1",
        model="NVIDIA A100",
        memory=Amount(total=40960, default=40960, most=40960),
        cores=Amount(total=100, default=0, most=100),
        slots=Amount(total=10, default=1, most=1),
        shared=True,
        taints=(Taint("hami.io/unhealthy", "xid-79", "NoSchedule"),),
    )
    want = _want(())
    assert blocked(want, device, Held()) == (
        "GPU-a-1 has the taint hami.io/unhealthy=xid-79:NoSchedule (hami found it unhealthy: "
        "critical Xid 79), which claim c request 'gpu' does not tolerate"
    )
    tolerate = Toleration(key="hami.io/unhealthy", operator="Exists", value="", effect="")
    assert blocked(_want((tolerate,)), device, Held()) is None


def _want(tolerations: tuple[Toleration, ...]) -> Want:
    return Want(
        label="claim c request 'gpu'",
        driver="nvidia.hami.io",
        count=1,
        memory=1000,
        cores=None,
        use_models=(),
        nouse_models=(),
        tolerations=tolerations,
        distinct=False,
    )
