"""The seam through which a backend tells the scheduler how to read a node's devices of its
type (``Backend.devices_from_node``, Go HAMi's ``GetNodeDevices``), with Cambricon as Go HAMi
2.10 reads it: from kubelet capacity on a node set up for Cambricon's own device plugin, from
the register value on a node of this project's agent (issue 24)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from _core_helpers import NOW, pod

from hami.backends import BackendSettings
from hami.backends.base import Device
from hami.backends.cambricon import CambriconBackend
from hami.backends.cambricon_go import ASSIGNED, PROFILE, devices_from_capacity
from hami.backends.fake import FakeBackend
from hami.core.cluster import Cluster
from hami.core.requests import DeviceKind, parse_pod
from hami.protocol import ContainerDevice, NodeDevice, ProtocolError

VCORE = "cambricon.com/mlu.smlu.vcore"
VMEM = "cambricon.com/mlu.smlu.vmemory"
REGISTER = "hami.io/node-mlu-register"


def mlu() -> CambriconBackend:
    return CambriconBackend(BackendSettings(options={"cnmon": "/nonexistent"}))


def go_node(
    capacity: dict[str, Any], name: str = "n1", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Node as Cambricon's dynamic-sMLU plug-in leaves it: capacities, no hami keys."""
    return {
        "metadata": {"name": name, "resourceVersion": "1", "annotations": annotations or {}},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def mlu_pod(limits: dict[str, Any]) -> dict[str, Any]:
    return pod({"name": "c", "resources": {"limits": limits}})


def test_the_default_reading_is_the_register_value_and_keeps_the_fast_path() -> None:
    backend = FakeBackend(BackendSettings(options={"type": "xpu", "devices": []}))
    value = "XPU-a,10,1000,100,X,0,true:"
    node = go_node({}, annotations={"hami.io/node-xpu-register": value})
    assert backend.devices_from_node(node) == [NodeDevice("XPU-a", 10, 1000, 100, "X", 0, True)]
    assert backend.devices_from_node(go_node({})) is None
    assert backend.node_reader is None  # the cluster decodes the value only when it changes
    assert DeviceKind.from_backend(backend).devices_from_node is None


def test_cambricon_cards_from_capacity_as_go_counts_them() -> None:
    node = go_node({VCORE: "200", VMEM: "184"})
    assert devices_from_capacity(node, mlu().resources) == [
        NodeDevice(f"n1-cambricon-mlu-{i}", 100, 23552, 100, "MLU", 0, True, index=i)
        for i in range(2)
    ]
    # A rest below 100 units is a card too; memory is spread over all units, truncated.
    cards = devices_from_capacity(go_node({VCORE: "150", VMEM: "3"}), mlu().resources)
    assert cards is not None
    assert [(c.uuid, c.memory) for c in cards] == [
        ("n1-cambricon-mlu-0", 512),
        ("n1-cambricon-mlu-1", 512),
    ]
    assert devices_from_capacity(go_node({VCORE: "100"}), mlu().resources) == [
        NodeDevice("n1-cambricon-mlu-0", 100, 0, 100, "MLU", 0, True)
    ]
    assert devices_from_capacity(go_node({VCORE: "0", VMEM: "8"}), mlu().resources) is None
    assert devices_from_capacity(go_node({"cpu": "8"}), mlu().resources) is None
    with pytest.raises(ProtocolError, match="vcore"):
        devices_from_capacity(go_node({VCORE: "1.5"}), mlu().resources)


def test_the_register_value_wins_over_capacity() -> None:
    backend = mlu()
    value = "MLU-a,10,23308,0,MLU-MLU370-X4,0,true:"
    node = go_node({VCORE: "100", VMEM: "91"}, annotations={REGISTER: value})
    assert [d.uuid for d in backend.devices_from_node(node) or []] == ["MLU-a"]
    assert [d.uuid for d in backend.devices_from_node(go_node({VCORE: "100"})) or []] == [
        "n1-cambricon-mlu-0"
    ]


def cluster() -> Cluster:
    return Cluster([DeviceKind.from_backend(mlu())], handshake_timeout=timedelta(seconds=60))


def test_the_scheduler_places_a_pod_on_a_node_of_gos_cambricon_plugin() -> None:
    c = cluster()
    errors, changes = c.upsert_node(go_node({VCORE: "200", VMEM: "184"}), NOW)
    assert errors == []
    assert [(ch.type_word, ch.available) for ch in changes] == [("mlu", True)]
    state = c.nodes["n1"].types["mlu"]
    assert [d.uuid for d in state.devices] == ["n1-cambricon-mlu-0", "n1-cambricon-mlu-1"]
    # No heartbeat: Go keeps none for these nodes, so none is stamped and none expires.
    writes, _ = c.refresh(NOW + timedelta(hours=1))
    assert writes == []
    assert state.available
    request = parse_pod(
        mlu_pod({"cambricon.com/vmlu": 1, VMEM: 4, VCORE: 10}), list(c.kinds.values())
    )
    assert request is not None
    decision = c.decide(request, ["n1"])
    assert decision.node == "n1" and decision.fit is not None
    [[device]] = decision.fit.assignment["mlu"]
    assert (device.vendor, device.memory, device.cores) == ("MLU", 1024, 10)
    assert device.uuid.startswith("n1-cambricon-mlu-")


def test_capacity_changes_are_read_again_and_bad_capacity_offers_nothing() -> None:
    c = cluster()
    c.upsert_node(go_node({VCORE: "100", VMEM: "92"}), NOW)
    c.upsert_node(go_node({VCORE: "300", VMEM: "276"}), NOW)
    assert len(c.nodes["n1"].types["mlu"].devices) == 3
    errors, changes = c.upsert_node(go_node({VCORE: "lots"}), NOW)
    assert "vcore" in errors[0]
    assert [ch.available for ch in changes] == [False]
    assert c.nodes["n1"].types["mlu"].devices == []
    _, changes = c.upsert_node(go_node({VCORE: "100", VMEM: "92"}), NOW)
    assert [ch.available for ch in changes] == [True]


def test_a_reader_that_crashes_costs_its_type_on_that_node_only() -> None:
    def broken(node: Any) -> list[NodeDevice] | None:
        raise RuntimeError("plug-in bug")

    kind = DeviceKind.from_backend(mlu())
    c = Cluster([DeviceKind(**{**_fields(kind), "devices_from_node": broken})])
    errors, _ = c.upsert_node(go_node({VCORE: "100"}), NOW)
    assert "plug-in bug" in errors[0]
    assert not c.nodes["n1"].types["mlu"].available


def _fields(kind: DeviceKind) -> dict[str, Any]:
    return {name: getattr(kind, name) for name in kind.__slots__}  # type: ignore[attr-defined]


def test_this_projects_agent_node_keeps_its_register_and_heartbeat() -> None:
    c = cluster()
    value = "MLU-a,10,23308,0,MLU-MLU370-X4,0,true:"
    annotations = {REGISTER: value, "hami.io/node-handshake-mlu": "Reported_2024-05-20 09:59:59"}
    c.upsert_node(go_node({VCORE: "100", VMEM: "91"}, annotations=annotations), NOW)
    state = c.nodes["n1"].types["mlu"]
    assert [d.uuid for d in state.devices] == ["MLU-a"] and state.heartbeat and state.available
    writes, _ = c.refresh(NOW + timedelta(minutes=5))
    assert writes  # the handshake goes on as before


def test_dsmlu_profile_is_the_first_device_given_as_go_writes_it() -> None:
    backend = mlu()
    kind = DeviceKind.from_backend(backend)
    assert kind.pod_annotations is not None
    containers = [[], [ContainerDevice("n1-cambricon-mlu-1", "MLU", 1024, 10)]]
    index = {"n1-cambricon-mlu-1": 1}.__getitem__
    assert kind.pod_annotations(containers, index) == {ASSIGNED: "false", PROFILE: "1_10_4"}
    assert kind.pod_annotations([], index) == {}
    assert FakeBackend(BackendSettings(options={"devices": []})).pod_annotator is None


def test_the_agent_advertises_the_capacities_go_reads() -> None:
    backend = mlu()
    card = Device("MLU-a", 0, "MLU-MLU370-X4", 23308)
    assert backend.capacity_units(card) == {VCORE: 100, VMEM: 91}
    # What Go reads back from two such cards: two cards of 91 x 256 MiB.
    node = go_node({VCORE: "200", VMEM: "182"})
    assert [d.memory for d in devices_from_capacity(node, backend.resources) or []] == [23296] * 2
