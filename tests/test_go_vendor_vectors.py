"""The Cambricon and Hygon cases of tests/data/go-vendor-vectors.json: what HAMi v2.10's own
device functions returned (``GetNodeDevices``, ``MutateAdmission`` + ``GenerateResourceRequests``,
``PatchAnnotations``), against this project's backends (issue 24).

Both ways: nodes set up for Go's plug-ins are read here as Go reads them, and the nodes this
project's MLU agent serves are read by Go's own function as this project's agent means them
(the capacities it advertises give Go the cards). The disagreements that stay are listed in
DELIBERATE with their reason; a listed case must still disagree and an unlisted disagreement
fails, so the list cannot silently grow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _data import data_json

from hami.backends import BackendSettings
from hami.backends.base import Backend, Device
from hami.backends.cambricon import CambriconBackend
from hami.backends.cambricon_go import devices_from_capacity
from hami.backends.hygon import HygonBackend
from hami.core.requests import (
    DeviceKind,
    RequestError,
    asks_for,
    container_resources,
    parse_device_request,
)
from hami.protocol import ContainerDevice, NodeDevice, ProtocolError, encode_pod_devices

ROOT = Path(__file__).resolve().parent.parent
GO: dict[str, Any] = data_json("go-vendor-vectors.json")
CASES = json.loads((ROOT / "tools/gohami-vectors/vendors/cases.json").read_text())

BACKENDS: dict[str, Backend] = {
    "cambricon": CambriconBackend(BackendSettings(options={"cnmon": "/nonexistent"})),
    "hygon": HygonBackend(),
}
KINDS = {vendor: DeviceKind.from_backend(b) for vendor, b in BACKENDS.items()}

NEGATIVE = "protocol.md §8: negative memory is rejected (as usage it would add room)"
WRAPPED = "Go wraps the per-card memory to int32 (a negative card); here it is refused"
JSON_DCU = "one register reader for every type: the JSON form is read for DCU too (Go: 7/9 fields)"
REFUSED = (
    "a value that is not a whole number >= 0 (or cores above 100) is refused with what to fix; "
    "Go drops the container's request or the field silently (protocol.md §3)"
)
DEFAULT_COUNT = (
    "memory or cores without a count mean scheduler.default_device_count devices, which the "
    "webhook writes (docs/interop.md 'Webhook'); Go's webhook leaves such a container alone"
)
REQUESTS_ONLY = (
    "a device named only in requests is taken by the webhook (the API server refuses it "
    "anyway: extended resources need limits); Go's MutateAdmission reads limits only"
)

DELIBERATE: dict[str, dict[str, str]] = {
    "nodes": {
        "cambricon-memory-negative": NEGATIVE,
        "cambricon-memory-int32-overflow": WRAPPED,
        "hygon-json-form": JSON_DCU,
        "hygon-negative-memory": NEGATIVE,
    },
    "containers": {
        "cambricon-memory-zero": REFUSED,
        "cambricon-cores-150": REFUSED,
        "cambricon-memory-negative": REFUSED,
        "cambricon-memory-fraction": REFUSED,
        "cambricon-cores-fraction": REFUSED,
        "cambricon-count-negative": REFUSED,
        "cambricon-count-fraction": REFUSED,
        "cambricon-memory-int32-overflow": REFUSED,
        "cambricon-memory-only": DEFAULT_COUNT,
        "cambricon-cores-only": DEFAULT_COUNT,
        "cambricon-requests-only": REQUESTS_ONLY,
        "hygon-memory-zero": REFUSED,
        "hygon-cores-150": REFUSED,
        "hygon-memory-negative": REFUSED,
        "hygon-memory-fraction": REFUSED,
        "hygon-cores-fraction": REFUSED,
        "hygon-cores-negative": REFUSED,
        "hygon-count-negative": REFUSED,
        "hygon-count-fraction": REFUSED,
        "hygon-count-int32-overflow": REFUSED,
        "hygon-memory-only": DEFAULT_COUNT,
        "hygon-cores-only": DEFAULT_COUNT,
        "hygon-requests-only": REQUESTS_ONLY,
    },
    "pod_values": {},
}


def _cases(section: str, agent: bool = False) -> list[Any]:
    """A section's cases; for nodes, those of Go's plug-ins or (``agent``) this project's."""
    return [
        pytest.param(case, id=case["name"])
        for case in GO[section]
        if ("agent_cards_mib" in case) == agent and case["vendor"] in BACKENDS
    ]  # Ascend's cases: tests/test_go_ascend_vectors.py


def _judge(section: str, case: dict[str, Any], agrees: bool, detail: str) -> None:
    reason = DELIBERATE[section].get(case["name"])
    if reason is None:
        assert agrees, f"{case['name']} disagrees with Go HAMi: {detail}"
    else:
        assert not agrees, f"{case['name']} now agrees with Go; drop it from DELIBERATE ({reason})"


# ------------------------------------------------------------------ the file itself


def test_the_file_holds_exactly_the_committed_inputs() -> None:
    for section, fields in (
        ("nodes", ("name", "vendor", "node")),
        ("containers", ("name", "vendor", "container")),
        ("pod_values", ("name", "vendor", "containers")),
    ):
        made = [{f: case[f] for f in fields} for case in GO[section]]
        assert made == [{f: case[f] for f in fields} for case in CASES[section]], section
    assert GO["about"]["hami"] == "4707fb02c91c545bc7343ce26dba4c32919f9a3e"


def test_keys_are_gos() -> None:
    keys = GO["keys"]
    mlu, dcu = BACKENDS["cambricon"], BACKENDS["hygon"]
    assert (mlu.to_allocate_key, mlu.allocated_key) == (
        keys["cambricon_to_allocate"],
        keys["cambricon_allocated"],
    )
    assert (dcu.to_allocate_key, dcu.allocated_key) == (
        keys["hygon_to_allocate"],
        keys["hygon_allocated"],
    )
    assert (dcu.register_key, dcu.handshake_keys) == (
        keys["hygon_register"],
        (keys["hygon_handshake"],),
    )
    config = GO["about"]["config"]
    for vendor in ("cambricon", "hygon"):
        names = BACKENDS[vendor].resources
        assert (names.count, names.memory, names.cores) == (
            config[vendor]["resourceCountName"],
            config[vendor]["resourceMemoryName"],
            config[vendor]["resourceCoreName"],
        )
    assert config["hygon"]["memoryFactor"] == BACKENDS["hygon"].resources.memory_unit_mib


# ------------------------------------------------------------------ node reading


def _go_devices(case: dict[str, Any], by_position: bool) -> list[tuple[Any, ...]]:
    fields = ("id", "index", "count", "devmem", "devcore", "type", "numa", "health")
    return [
        tuple(i if by_position and f == "index" else d[f] for f in fields)
        for i, d in enumerate(case["go"]["devices"])
    ]


def _ours(devices: list[NodeDevice] | None) -> list[tuple[Any, ...]]:
    return [
        (d.uuid, d.index, d.count, d.memory, d.cores, d.model, d.numa, d.healthy)
        for d in devices or []
    ]


def _seven_field(node: dict[str, Any]) -> bool:
    """The 7-field form numbers devices by position here; Go gives each index 0 (§8)."""
    value = (node["metadata"].get("annotations") or {}).get(BACKENDS["hygon"].register_key, "")
    return len(value.split(":")[0].split(",")) == 7


@pytest.mark.parametrize("case", _cases("nodes"))
def test_nodes_are_read_as_go_reads_them(case: dict[str, Any]) -> None:
    backend = BACKENDS[case["vendor"]]
    node = case["node"]
    try:
        ours = _ours(backend.devices_from_node(node))
        detail = f"ours {ours}"
    except ProtocolError as exc:
        ours, detail = [], f"ours refused: {exc}"
    go = _go_devices(case, by_position=_seven_field(node))
    # An error in Go and None, [] or a refusal here all mean: no device of the type.
    _judge("nodes", case, ours == go, f"{detail}; go {go} {case['go'].get('error', '')}")


@pytest.mark.parametrize("case", _cases("nodes", agent=True))
def test_go_reads_this_projects_mlu_agent(case: dict[str, Any]) -> None:
    """Go's scheduler over this project's agent: the capacities the agent advertises for its
    cards (``capacity_units``) are the node's, and Go's own reading of them gives one card
    per card of the agent, each with the agent's memory in whole 256 MiB units."""
    backend = BACKENDS["cambricon"]
    node = case["node"]
    cards = [
        Device(f"MLU-{i}", i, "MLU-MLU370-X4", mib) for i, mib in enumerate(case["agent_cards_mib"])
    ]
    advertised: dict[str, int] = {}
    for card in cards:
        for name, units in backend.capacity_units(card).items():
            advertised[name] = advertised.get(name, 0) + units
    capacity = node["status"]["capacity"]
    assert {name: str(units) for name, units in advertised.items()} == {
        name: capacity[name] for name in advertised
    }
    go = _go_devices(case, by_position=False)
    assert [(d[0], d[3], d[4]) for d in go] == [
        (f"mlu-node-cambricon-mlu-{i}", mib // 256 * 256, 100)
        for i, mib in enumerate(case["agent_cards_mib"])
    ]
    # This project's model of Go's reading agrees with Go on the same node ...
    assert _ours(devices_from_capacity(node, backend.resources)) == go
    # ... while this project's scheduler reads the agent's own register value there.
    ours = backend.devices_from_node(node) or []
    assert [d.uuid for d in ours] == [
        "MLU-45013011-2257-0000-0000-000000000000",
        "MLU-54043011-2257-0000-0000-000000000000",
    ][: len(cards)]


# ------------------------------------------------------------------ webhook and requests


def _our_request(case: dict[str, Any]) -> tuple[bool, Any]:
    kind = KINDS[case["vendor"]]
    container = case["container"]
    mutate = asks_for(container, [kind])
    try:
        found = parse_device_request(container_resources(container), kind, "container c")
    except RequestError as exc:
        return mutate, f"refused: {exc}"
    if found is None:
        return mutate, None
    return mutate, {
        "nums": found.count,
        "type": found.vendor,
        "memreq": found.memory,
        "mempercentagereq": found.memory_percentage or 0,
        "coresreq": found.cores,
    }


@pytest.mark.parametrize("case", _cases("containers"))
def test_containers_are_taken_and_asked_for_as_go_does(case: dict[str, Any]) -> None:
    go = case["go"]
    request = go["request"] if go["request"]["nums"] > 0 else None  # Go skips Nums <= 0
    ours = _our_request(case)
    _judge("containers", case, ours == (go["mutate"], request), f"ours {ours}; go {go}")


# ------------------------------------------------------------------ pod values


@pytest.mark.parametrize("case", _cases("pod_values"))
def test_pod_annotations_are_written_as_go_writes_them(case: dict[str, Any]) -> None:
    kind = KINDS[case["vendor"]]
    containers = [
        [ContainerDevice(d["uuid"], d["type"], d["usedmem"], d["usedcores"]) for d in devices]
        for devices in case["containers"]
    ]
    index = {d["uuid"]: d["idx"] for devices in case["containers"] for d in devices}
    ours: dict[str, str] = {}
    if containers:  # the scheduler writes a type's values only when it gives that type
        value = encode_pod_devices(containers)
        ours = {kind.to_allocate_key: value, kind.allocated_key: value}
        if kind.pod_annotations is not None:
            ours.update(kind.pod_annotations(containers, index.__getitem__))
    go = case["go"]["annotations"]
    _judge("pod_values", case, ours == go, f"ours {ours}; go {go}")
