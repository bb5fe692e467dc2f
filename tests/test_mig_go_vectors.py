"""Every case of tests/data/hami-go-v2.10-mig.json: what Go HAMi v2.10's own dynamic-MIG
functions returned (tools/gohami-vectors/mig, run by scripts/gen-go-vectors.sh mig),
against hami.protocol.mig and the register codec (issue 23 item 6).

As in test_go_vectors.py, the disagreements that stay are listed in DELIBERATE with the
protocol.md rule that makes them so; a listed case must still disagree, and an unlisted
disagreement fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _data import data_json

from hami.protocol import ProtocolError, decode_node_devices, keys
from hami.protocol.mig import (
    MIG_ALLOCATIONS_KEY,
    MIG_MODE,
    AllowedMigProfiles,
    MigAllocation,
    MigPlacement,
    MigProfile,
    decode_mig_allocations,
    encode_mig_allocations,
    select_mig_profile,
    validate_mig_profile_allowlist,
)
from hami.protocol.register import NodeDevice, encode_node_devices_json

ROOT = Path(__file__).resolve().parent.parent
GO: dict[str, Any] = data_json("hami-go-v2.10-mig.json")
CASES: dict[str, Any] = json.loads((ROOT / "tools/gohami-vectors/mig/cases.json").read_text())

NEGATIVE = "§8/§10: a negative MIG profile memoryMB or core rejects the register value"
NULL_PLACEMENTS = "§10: no placements are written as null, as Go's device plugin writes them"

DELIBERATE: dict[str, dict[str, str]] = {
    "allowlist": {},
    "select": {},
    "allocations_encode": {},
    "allocations_decode": {},
    "register_encode": {"empty-placements": NULL_PLACEMENTS},
    "register_decode": {"negative-memory": NEGATIVE, "negative-core": NEGATIVE},
}


def _cases(section: str) -> list[Any]:
    return [pytest.param(case, id=case["name"]) for case in GO[section]]


def _judge(section: str, case: dict[str, Any], agrees: bool, detail: str) -> None:
    reason = DELIBERATE[section].get(case["name"])
    if reason is None:
        assert agrees, f"{case['name']} disagrees with Go HAMi 2.10: {detail}"
    else:
        assert not agrees, f"{case['name']} is listed as deliberate ({reason}) but agrees now"


def test_every_section_is_covered_and_made_from_the_committed_cases() -> None:
    assert set(GO) - {"about", "keys"} == set(DELIBERATE)
    assert set(CASES) - {"about"} == set(DELIBERATE)
    assert GO["about"]["hami"] == "4707fb02c91c545bc7343ce26dba4c32919f9a3e"
    assert "scripts/gen-go-vectors.sh mig" in GO["about"]["command"]
    for section in DELIBERATE:
        assert [c["name"] for c in GO[section]] == [c["name"] for c in CASES[section]]
        for given, made in zip(CASES[section], GO[section], strict=True):
            for key in ("value", "entries", "containers", "requests"):
                if key in given and not (key == "value" and section.endswith("encode")):
                    if key == "requests":
                        assert given[key] == [r["memory"] for r in made[key]], given["name"]
                    else:
                        assert given[key] == made[key], (section, given["name"])


def test_the_keys_are_go_hamis() -> None:
    assert GO["keys"]["mig_allocations"] == MIG_ALLOCATIONS_KEY
    assert GO["keys"]["mig_mode"] == MIG_MODE
    assert keys.MIG_ALLOCATIONS == MIG_ALLOCATIONS_KEY


# --------------------------------------------------------------------------- conversions


def _placement(go: dict[str, Any]) -> MigPlacement:
    return MigPlacement(go["start"], go["size"])


def _profile(go: dict[str, Any]) -> MigProfile:
    return MigProfile(
        name=go.get("name", ""),
        memory_mb=go.get("memoryMB", 0),
        core=go.get("core", 0),
        slice_count=go.get("sliceCount", 0),
        placements=tuple(_placement(p) for p in go.get("placements") or []),
    )


def _go_profile(profile: MigProfile) -> dict[str, Any]:
    return {
        "name": profile.name,
        "memoryMB": profile.memory_mb,
        "core": profile.core,
        "sliceCount": profile.slice_count,
        "placements": [{"start": p.start, "size": p.size} for p in profile.placements],
    }


def _go_allocation(a: MigAllocation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "containerIndex": a.container_index,
        "deviceIndex": a.device_index,
        "gpuUUID": a.gpu_uuid,
        "profile": a.profile,
        "placement": {"start": a.placement.start, "size": a.placement.size},
    }
    if a.mig_uuid:
        out["migUUID"] = a.mig_uuid
    if a.gpu_instance_id is not None:
        out["gpuInstanceID"] = a.gpu_instance_id
    if a.compute_instance_id is not None:
        out["computeInstanceID"] = a.compute_instance_id
    return out


def _node_device(go: dict[str, Any]) -> NodeDevice:
    return NodeDevice(
        uuid=go.get("id", ""),
        count=go.get("count", 0),
        memory=go.get("devmem", 0),
        cores=go.get("devcore", 0),
        model=go.get("type", ""),
        numa=go.get("numa", 0),
        healthy=go.get("health", False),
        index=go.get("index", 0),
        mode=go.get("mode", ""),
        mig_profiles=tuple(_profile(p) for p in go.get("migProfiles") or []),
    )


def _go_device(device: NodeDevice) -> dict[str, Any]:
    """A NodeDevice as the generator records Go's DeviceInfo (placements and profiles as
    lists; Go's nil and empty lists both compare as empty)."""
    return {
        "id": device.uuid,
        "index": device.index,
        "count": device.count,
        "devmem": device.memory,
        "devcore": device.cores,
        "type": device.model,
        "numa": device.numa,
        "mode": device.mode,
        "health": device.healthy,
        "migProfiles": [_go_profile(p) for p in device.mig_profiles],
    }


def _normal(go: dict[str, Any]) -> dict[str, Any]:
    profiles = go["migProfiles"] or []
    return go | {
        "migProfiles": [p | {"placements": p["placements"] or []} for p in profiles],
    }


# --------------------------------------------------------------------------- allow-list


@pytest.mark.parametrize("case", _cases("allowlist"))
def test_allowlist_is_checked_as_go_checks_it(case: dict[str, Any]) -> None:
    try:
        checked = validate_mig_profile_allowlist(case["entries"])
        ours, error = True, ""
    except ValueError as exc:
        ours, error = False, str(exc)
    _judge("allowlist", case, ours == case["go"]["ok"], f"ours {ours} {error}, Go {case['go']}")
    if ours:
        assert checked == tuple(
            AllowedMigProfiles(tuple(e["models"]), tuple(e["profiles"])) for e in case["entries"]
        )


# --------------------------------------------------------------------------- choice


@pytest.mark.parametrize("case", _cases("select"))
def test_profile_and_placement_are_chosen_as_go_chooses(case: dict[str, Any]) -> None:
    """Each request in turn on one GPU, its placement then occupied, as Go's scheduler
    (CustomFilterRule to filter, AddResourceUsage to pick and record) does."""
    profiles = [_profile(p) for p in case["profiles"] or []]
    occupied = [_placement(p) for p in case["occupied"] or []]
    ours: list[Any] = []
    go: list[Any] = []
    for request in case["requests"]:
        chosen = select_mig_profile(profiles, occupied, request["memory"])
        assert (chosen is not None) == request["go_filter_fits"]
        if chosen is None:
            ours.append(None)
        else:
            profile, placement = chosen
            occupied.append(placement)
            ours.append((profile.name, placement, profile.memory_mb, profile.core))
        g = request["go"]
        go.append(
            (g["profile"], _placement(g["placement"]), g["usedmem"], g["usedcores"])
            if g["ok"]
            else None
        )
    _judge("select", case, ours == go, f"ours {ours}, Go {go}")


# --------------------------------------------------------------------------- allocations


def _allocations_from_containers(containers: list[list[dict[str, Any]]]) -> list[MigAllocation]:
    """What Go's EncodeMigAllocations takes from a pod's devices: each device with a
    profile and a placement of non-zero size, numbered by container and device."""
    return [
        MigAllocation(c, d, slot["uuid"], slot["profile"], _placement(slot["placement"]))
        for c, devices in enumerate(containers)
        for d, slot in enumerate(devices)
        if slot["profile"] and slot["placement"]["size"]
    ]


@pytest.mark.parametrize("case", _cases("allocations_encode"))
def test_allocations_are_written_byte_for_byte_as_go_writes_them(case: dict[str, Any]) -> None:
    allocations = _allocations_from_containers(case["containers"])
    # Go's scheduler writes no annotation when there is nothing to reserve.
    assert bool(allocations) == case["go_ok"]
    written = encode_mig_allocations(allocations) if allocations else ""
    _judge("allocations_encode", case, written == case["value"], f"wrote {written!r}")
    if allocations:
        assert decode_mig_allocations(written) == allocations
        assert case["go_decoded"]["ok"]


@pytest.mark.parametrize("case", _cases("allocations_decode"))
def test_allocations_read_as_go_reads_them(case: dict[str, Any]) -> None:
    go = case["go"]
    try:
        decoded: list[MigAllocation] | None = decode_mig_allocations(case["value"])
        error = ""
    except ProtocolError as exc:
        decoded, error = None, str(exc)
        assert MIG_ALLOCATIONS_KEY in error
    ours = None if decoded is None else [_go_allocation(a) for a in decoded]
    expected = (go["allocations"] or []) if go["ok"] else None
    _judge("allocations_decode", case, ours == expected, f"ours {ours or error}, Go {go}")
    if decoded is not None and go["ok"] and not go["null"]:
        # Go's device plugin writes back json.Marshal of what it read: so do we, byte for byte.
        assert encode_mig_allocations(decoded) == go["marshal"]


# --------------------------------------------------------------------------- register


def _ours(value: str) -> tuple[list[dict[str, Any]] | None, str]:
    try:
        return [_go_device(d) for d in decode_node_devices(value)], ""
    except ProtocolError as exc:
        return None, str(exc)


def _go_devices(result: dict[str, Any]) -> list[dict[str, Any]] | None:
    if not result["ok"] or "error" in result:
        return None
    return [_normal(d) for d in result["devices"]]


@pytest.mark.parametrize("case", _cases("register_encode"))
def test_mig_register_is_written_byte_for_byte_as_go_writes_it(case: dict[str, Any]) -> None:
    devices = [_node_device(d) for d in case["devices"]]
    written = encode_node_devices_json(devices)
    _judge("register_encode", case, written == case["value"], f"wrote {written!r}")
    # Whatever the bytes, Go read ours back to the same devices, and we read Go's.
    assert _go_devices(case["go_decoded"]) == [_go_device(d) for d in devices]
    assert decode_node_devices(case["value"]) == devices
    assert decode_node_devices(written) == devices


@pytest.mark.parametrize("case", _cases("register_decode"))
def test_mig_register_reads_as_go_reads_it(case: dict[str, Any]) -> None:
    ours, error = _ours(case["value"])
    go = _go_devices(case["go"])
    _judge("register_decode", case, ours == go, f"ours {ours or error}, Go {go}")
    if case["name"] not in DELIBERATE["register_decode"]:
        # Go HAMi 2.10's NVIDIA scheduler (GetNodeDevices) reads the same profiles.
        nvidia = case["go_nvidia_getnodedevices"]
        assert nvidia["ok"] == (ours is not None)
        if ours is not None:
            assert [_normal(d) for d in nvidia["devices"]] == ours
