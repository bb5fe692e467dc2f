"""Every case of tests/data/hami-go-v2.10.json: what HAMi v2.10's own Go functions
returned, against this project's readers and writers (issue 10 item 6).

Each test asserts agreement with Go. The disagreements that stay are listed in DELIBERATE
with the protocol.md rule that makes them so; a listed case must still disagree (a stale
entry fails), and an unlisted disagreement fails, so the list cannot silently grow.
Two rules of protocol.md §8 apply to every case and are applied as transformations rather
than listed: pod values carry no extra empty entry after the final ``;`` (Go's decoder keeps
one), and the 7-field register form numbers devices by position (Go gives each index 0).
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _data import data_json

from hami.backends.fake import FakeBackend
from hami.core.cluster import Cluster
from hami.core.requests import DeviceKind
from hami.protocol import (
    ContainerDevice,
    NodeDevice,
    ProtocolError,
    decode_node_devices,
    decode_pod_devices,
    encode_node_devices,
    encode_pod_devices,
    keys,
    parse_lock,
)
from hami.protocol.mig import MigPlacement, MigProfile
from hami.protocol.nodelock import rfc3339
from hami.protocol.register import encode_node_devices_json

ROOT = Path(__file__).resolve().parent.parent
GO: dict[str, Any] = data_json("hami-go-v2.10.json")

# protocol.md §8: "this project rejects values Go accepts but cannot round-trip".
NEGATIVE = "§8: negative counts, memory or cores are rejected (as usage they would add room)"
SEPARATORS = "§8: ids with separators (, : ;) cannot round-trip, so they are not written"
CORES = "§8/§3: a container's cores are a percent of one device (0..100); Go accepts more"
TAIL = "§3: text after the final ';' that is no device rejects the value (Go ignores it)"
BRACKET = "§8 ids: the seed writer refuses an id starting with '[' (read as JSON first)"
EMPTY_ID = "our pod writer never writes an empty uuid or vendor word (no device has one)"
NO_DEVICES = "§1: a backend with no devices writes nothing (Go's readers reject '' too)"
NULL_ITEM = "Go's generic reader takes a null device; its NVIDIA reader then panics"
# protocol.md §2's handshake table, which this project keeps where Go HAMi differs.
DELETED = "§2: 'Deleted' makes the type unavailable (Go re-stamps it as healthy)"
UNPARSABLE = "§2: an unreadable stamp is re-stamped Requesting_{now} and expires (Go leaves it)"
READABLE = "§2: readers also take 'YYYY.MM.DD' and 'Requesting ' stamps and judge their age"
FAR_OFF = "§2 'Far-off timestamps': a stamp far ahead is re-stamped (Go keeps it forever)"
# protocol.md §5: a malformed lock is stale. Go writes neither form below.
LOCK_NO_OWNER = "§5: a 3-part lock with an empty namespace or pod names no pod: malformed"
LOCK_ZONE = "§5: RFC 3339 zone offsets are below 24:00; Go's parser also takes +24:00"
LOCK_LENIENT = "§5/§8: a lock time with ' ' or 't' before the hour, 'z', or no zone (UTC) is read"

DELIBERATE: dict[str, dict[str, str]] = {
    "register_json_decode": {
        "json-decode-004": NULL_ITEM,
        "json-decode-021": NEGATIVE,
        "json-decode-022": NEGATIVE,
        "json-decode-023": NEGATIVE,
        "json-decode-024": NEGATIVE,
    },
    "register_legacy_decode": {
        "legacy-decode-019": NEGATIVE,
        "legacy-decode-020": NEGATIVE,
        "legacy-decode-021": NEGATIVE,
    },
    "register_json_encode": {"json-encode-006": NEGATIVE},
    "register_legacy_encode": {"legacy-encode-006": NEGATIVE},
    "register_python_form": {
        "seven-field-000": NO_DEVICES,
        "seven-field-006": NEGATIVE,
        "seven-field-008": SEPARATORS,
        "seven-field-009": BRACKET,
    },
    "pod_devices_decode": {
        "pod-decode-020": CORES,
        "pod-decode-021": NEGATIVE,
        "pod-decode-038": TAIL,
    },
    "pod_devices_encode": {
        "encode-int32-max": CORES,
        "encode-int32-min": NEGATIVE,
        "encode-empty-uuid": EMPTY_ID,
        "encode-empty-type": EMPTY_ID,
        "encode-uuid-with-comma": SEPARATORS,
        "encode-uuid-with-colon": SEPARATORS,
        "encode-uuid-with-semicolon": SEPARATORS,
    },
    "handshake": {
        "handshake-deleted-alloc0": DELETED,
        "handshake-deleted-alloc80": DELETED,
        "handshake-deleted-recent-alloc0": DELETED,
        "handshake-deleted-recent-alloc80": DELETED,
        "handshake-requesting-future-alloc0": FAR_OFF,
        "handshake-requesting-future-alloc80": FAR_OFF,
        "handshake-requesting-no-underscore-alloc0": UNPARSABLE,
        "handshake-requesting-no-underscore-alloc80": UNPARSABLE,
        "handshake-requesting-garbage-alloc0": UNPARSABLE,
        "handshake-requesting-garbage-alloc80": UNPARSABLE,
        "handshake-requesting-rfc3339-1h-alloc0": UNPARSABLE,
        "handshake-requesting-rfc3339-1h-alloc80": UNPARSABLE,
        "handshake-requesting-trailing-1h-alloc0": UNPARSABLE,
        "handshake-requesting-trailing-1h-alloc80": UNPARSABLE,
        "handshake-x-requesting-1h-alloc0": UNPARSABLE,
        "handshake-x-requesting-1h-alloc80": UNPARSABLE,
        "handshake-requesting-old-dot-layout-1h-alloc0": READABLE,
        "handshake-requesting-space-1h-alloc0": READABLE,
    },
    "node_lock_parse": {
        "lock-parse-011": LOCK_LENIENT,
        "lock-parse-012": LOCK_LENIENT,
        "lock-parse-013": LOCK_LENIENT,
        "lock-parse-014": LOCK_LENIENT,
        "lock-parse-017": LOCK_NO_OWNER,
        "lock-parse-018": LOCK_NO_OWNER,
        "lock-parse-019": LOCK_NO_OWNER,
        "lock-parse-037": LOCK_ZONE,
    },
    "node_lock_generate": {},
}

SECTIONS = set(DELIBERATE) | {"register_getnodedevices"}


def _cases(section: str) -> list[Any]:
    return [pytest.param(case, id=case["name"]) for case in GO[section]]


def _judge(section: str, case: dict[str, Any], agrees: bool, detail: str) -> None:
    reason = DELIBERATE[section].get(case["name"])
    if reason is None:
        assert agrees, f"{case['name']} disagrees with Go HAMi 2.10: {detail}"
    else:
        assert not agrees, f"{case['name']} is listed as deliberate ({reason}) but agrees now"


def test_every_section_is_covered() -> None:
    assert set(GO) - {"about", "keys"} == SECTIONS, "new vector sections need tests"
    assert GO["about"]["hami"] == "4707fb02c91c545bc7343ce26dba4c32919f9a3e"
    assert "scripts/gen-go-vectors.sh codec" in GO["about"]["command"]


_STAMP = re.compile(r"\{now-(\d+)([smh])(?::(\w+))?\}")
_LAYOUTS = {None: "%Y-%m-%d %H:%M:%S", "dots": "%Y.%m.%d %H:%M:%S", "rfc3339": "%Y-%m-%dT%H:%M:%SZ"}


def _expand(template: str, now: datetime) -> str:
    def one(m: re.Match[str]) -> str:
        ago = timedelta(seconds=int(m[1]) * {"s": 1, "m": 60, "h": 3600}[m[2]])
        return (now.replace(microsecond=0) - ago).strftime(_LAYOUTS[m[3]])

    return _STAMP.sub(one, template)


_INPUTS = {"name", "value", "devices", "containers", "namespace", "pod", "zone_offset_s"}


def _inputs(section: str, case: dict[str, Any]) -> dict[str, Any]:
    """The fields of a vectors case that the generator took from cases.json."""
    picked = {k: v for k, v in case.items() if k in _INPUTS | {"allocatable"}}
    if section in ("register_json_encode", "register_legacy_encode", "node_lock_generate"):
        picked.pop("value", None)  # Go's output there
    if "devices" in picked:  # MIG profiles are recorded as a count
        picked["devices"] = [
            {k: v for k, v in d.items() if k != "migProfiles"}
            | ({"mig_profiles": len(d["migProfiles"])} if "migProfiles" in d else {})
            for d in picked["devices"]
        ]
    return picked


def test_the_vectors_are_the_generators_output_for_the_committed_cases() -> None:
    # tools/gohami-vectors/codec/cases.json is what scripts/gen-go-vectors.sh feeds Go HAMi;
    # a case edited there (or here) without running the generator again fails.
    cases = json.loads((ROOT / "tools/gohami-vectors/codec/cases.json").read_text())
    assert set(cases) - {"about"} == SECTIONS
    for section in SECTIONS:
        made = GO[section]
        assert [c["name"] for c in made] == [c["name"] for c in cases[section]], section
        for given, out in zip(cases[section], made, strict=True):
            if section == "handshake" and given["value"] is not None:
                given = given | {"value": _expand(given["value"], _now(out))}
            assert _inputs(section, given) == _inputs(section, out), (section, given["name"])


def test_the_keys_are_go_hamis() -> None:
    found = GO["keys"]
    assert found["nvidia_handshake"] == keys.NVIDIA_HANDSHAKE
    assert found["nvidia_handshake"] in keys.handshake_keys("nvidia")
    assert found["nvidia_register"] == keys.node_register("nvidia")
    assert found["node_lock"] == keys.NODE_LOCK
    assert found["bind_phase"] == keys.BIND_PHASE
    assert found["bind_time"] == keys.BIND_TIME
    assert found["vgpu_node"] == keys.VGPU_NODE
    assert found["vgpu_time"] == keys.VGPU_TIME
    backend = FakeBackend()
    assert found["nvidia_allocated"] == backend.allocated_key
    assert found["nvidia_to_allocate"] == backend.to_allocate_key
    assert found["nvidia_vendor_word"] == backend.vendor_word


# --------------------------------------------------------------------------- register


def _go_device(device: NodeDevice) -> dict[str, Any]:
    # The codec vectors record a device's MIG profiles as their number (the MIG vectors,
    # tests/test_mig_go_vectors.py, compare them whole).
    profiles = {"mig_profiles": len(device.mig_profiles)} if device.mig_profiles else {}
    return profiles | {
        "id": device.uuid,
        "index": device.index,
        "count": device.count,
        "devmem": device.memory,
        "devcore": device.cores,
        "type": device.model,
        "numa": device.numa,
        "mode": device.mode,
        "health": device.healthy,
    }


def _node_device(go: dict[str, Any], profiles: tuple[MigProfile, ...] = ()) -> NodeDevice:
    return NodeDevice(
        uuid=go["id"],
        count=go["count"],
        memory=go["devmem"],
        cores=go["devcore"],
        model=go["type"],
        numa=go["numa"],
        healthy=go["health"],
        index=go["index"],
        mode=go["mode"],
        mig_profiles=profiles,
    )


def _input_profiles(section: str, name: str) -> list[tuple[MigProfile, ...]]:
    """Each input device's MIG profiles, from cases.json (the vectors keep only a count)."""
    cases = json.loads((ROOT / "tools/gohami-vectors/codec/cases.json").read_text())
    (case,) = [c for c in cases[section] if c["name"] == name]
    return [
        tuple(
            MigProfile(
                name=p["name"],
                memory_mb=p["memoryMB"],
                core=p["core"],
                slice_count=p["sliceCount"],
                placements=tuple(MigPlacement(x["start"], x["size"]) for x in p["placements"]),
            )
            for p in d.get("migProfiles") or []
        )
        for d in case["devices"]
    ]


_EXTRA = ("devicevendor",)  # what Go's DeviceInfo holds and NodeDevice does not


def _go_devices(result: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Go's devices without its extra fields; None when Go refused the value. The NVIDIA
    reader's 'no gpu found on node' is an empty list (ours returns [] for the same values)."""
    if not result["ok"]:
        return [] if result.get("error") == "no gpu found on node" else None
    return [{k: v for k, v in d.items() if k not in _EXTRA} for d in result.get("devices") or []]


def _ours(value: str) -> tuple[list[dict[str, Any]] | None, str]:
    try:
        return [_go_device(d) for d in decode_node_devices(value)], ""
    except ProtocolError as exc:
        return None, str(exc)


def _seven_field_positions(value: str, devices: list[dict[str, Any]] | None) -> None:
    """§8: the 7-field form numbers devices by position where Go gives each index 0."""
    if devices is None:
        return
    segments = [s for s in value.split(":") if s]
    for device, segment in zip(devices, segments, strict=False):
        if segment.count(",") == 6:
            device["index"] = 0


@pytest.mark.parametrize("case", _cases("register_json_decode"))
def test_json_register_reads_as_go_reads_it(case: dict[str, Any]) -> None:
    ours, error = _ours(case["value"])
    go = _go_devices(case["go"])
    if case["go"].get("error", "").startswith("nil device"):
        # UnMarshalNodeDevices returns a nil device, which no NodeDevice list can equal.
        assert not case["go_nvidia_getnodedevices"]["ok"]
        _judge("register_json_decode", case, False, error)
        return
    _judge("register_json_decode", case, ours == go, f"ours {ours or error}, Go {go}")
    if case["name"] not in DELIBERATE["register_json_decode"]:
        # Go HAMi 2.10's NVIDIA scheduler reads NVIDIA registrations with GetNodeDevices.
        assert ours == _go_devices(case["go_nvidia_getnodedevices"])


def test_absent_register_is_no_devices_for_go_and_us() -> None:
    (case,) = GO["register_getnodedevices"]
    assert case["go_nvidia_getnodedevices"] == {
        "error": f"annos not found {keys.node_register('nvidia')}",
        "ok": False,
    }
    cluster = Cluster([DeviceKind.from_backend(FakeBackend())])
    cluster.upsert_node({"metadata": {"name": "n", "annotations": {}}}, datetime.now(UTC))
    assert "n" in cluster.nodes and not cluster.nodes["n"].types


@pytest.mark.parametrize("case", _cases("register_legacy_decode"))
def test_comma_register_reads_as_go_reads_it(case: dict[str, Any]) -> None:
    ours, error = _ours(case["value"])
    _seven_field_positions(case["value"], ours)
    go = _go_devices(case["go"])
    _judge("register_legacy_decode", case, ours == go, f"ours {ours or error}, Go {go}")


@pytest.mark.parametrize("case", _cases("register_json_encode"))
def test_json_register_is_written_byte_for_byte_as_go_writes_it(case: dict[str, Any]) -> None:
    profiles = _input_profiles("register_json_encode", case["name"])
    devices = [_node_device(d, p) for d, p in zip(case["devices"], profiles, strict=True)]
    try:
        written: str | None = encode_node_devices_json(devices)
    except ProtocolError:
        written = None
    _judge("register_json_encode", case, written == case["value"], f"wrote {written!r}")
    if written == case["value"]:
        # Go read it back as these devices, and so do we.
        assert _go_devices(case["go_decoded"]) == [_go_device(d) for d in devices]
        assert decode_node_devices(written) == devices


@pytest.mark.parametrize("case", _cases("register_legacy_encode"))
def test_go_nine_field_register_reads_back_as_its_devices(case: dict[str, Any]) -> None:
    ours, error = _ours(case["value"])
    go = _go_devices(case["go_decoded"])
    _judge("register_legacy_encode", case, ours == go, f"ours {ours or error}, Go {go}")
    if go is not None and ours == go:
        assert ours == [{k: v for k, v in d.items() if k not in _EXTRA} for d in case["devices"]]


@pytest.mark.parametrize("case", _cases("register_python_form"))
def test_seed_register_reads_in_go_hamis_comma_reader(case: dict[str, Any]) -> None:
    devices = [_node_device(d) for d in case["devices"]]
    try:
        written: str | None = encode_node_devices(devices) if devices else None
    except ProtocolError:
        written = None
    go = _go_devices(case["go_legacy_reader"])
    expected = [_go_device(d) | {"index": 0, "mode": "hami-core"} for d in devices]
    agrees = written == case["value"] and go == expected
    _judge("register_python_form", case, agrees, f"wrote {written!r}, Go read {go}")
    # Go HAMi >= 2.8's NVIDIA reader takes only JSON: why register_format: json exists.
    assert not case["go_nvidia_getnodedevices"]["ok"]
    if written is not None:
        assert decode_node_devices(written) == [
            dataclasses.replace(d, index=i, mode="hami-core") for i, d in enumerate(devices)
        ]


def test_the_json_writer_is_what_go_hami_reads_for_every_python_form_case() -> None:
    # The same devices in register_format: json read back in Go's JSON form exactly (the
    # byte-exact pins are json-encode-*); here: every writable device set round-trips.
    for case in GO["register_python_form"]:
        devices = [_node_device(d) for d in case["devices"]]
        if not devices or any(d.count < 0 or d.memory < 0 or d.cores < 0 for d in devices):
            continue
        assert decode_node_devices(encode_node_devices_json(devices)) == devices


# --------------------------------------------------------------------------- pod devices


def _pod(containers: list[list[ContainerDevice]]) -> list[list[dict[str, Any]]]:
    return [
        [{"uuid": d.uuid, "type": d.vendor, "usedmem": d.memory, "usedcores": d.cores} for d in c]
        for c in containers
    ]


def _without_trailing_entry(go: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """§8: Go's decoder keeps an entry for the piece after the final ';'; ours keeps it only
    when it holds devices (so both read each other's values to the same devices)."""
    return go[:-1] if go and not go[-1] else go


@pytest.mark.parametrize("case", _cases("pod_devices_decode"))
def test_pod_value_reads_as_go_reads_it(case: dict[str, Any]) -> None:
    try:
        ours: list[list[dict[str, Any]]] | None = _pod(decode_pod_devices(case["value"]))
        error = ""
    except ProtocolError as exc:
        ours, error = None, str(exc)
    go = _without_trailing_entry(case["go"]["containers"]) if case["go"]["ok"] else None
    _judge("pod_devices_decode", case, ours == go, f"ours {ours or error}, Go {go}")


def _container_devices(go: list[dict[str, Any]]) -> list[ContainerDevice]:
    return [ContainerDevice(d["uuid"], d["type"], d["usedmem"], d["usedcores"]) for d in go]


@pytest.mark.parametrize("case", _cases("pod_devices_encode"))
def test_pod_value_is_written_as_go_writes_it_and_reads_back_in_go(case: dict[str, Any]) -> None:
    agrees = True
    details: list[str] = []
    for vendor, containers in case["containers"].items():
        entries = [_container_devices(c) for c in containers]
        try:
            written: str | None = encode_pod_devices(entries)
        except ProtocolError:
            written = None
        go_value = case["go_single"][vendor]
        if written != go_value:
            agrees = False
            details.append(f"{vendor}: wrote {written!r}, Go {go_value!r}")
            continue
        # Go's reader read our (identical) value back to these containers, and so do we.
        go_read = _without_trailing_entry(case["go_decoded"][vendor])
        assert go_read == _pod(entries)
        assert _pod(decode_pod_devices(written)) == _pod(entries)
    _judge("pod_devices_encode", case, agrees, "; ".join(details))


# --------------------------------------------------------------------------- handshake


def _now(case: dict[str, Any]) -> datetime:
    text = case["now_utc"].replace("Z", "")
    head, _, fraction = text.partition(".")
    return datetime.fromisoformat(head).replace(tzinfo=UTC) + timedelta(
        microseconds=int((fraction + "000000")[:6]) if fraction else 0
    )


def _handshake_node(case: dict[str, Any]) -> dict[str, Any]:
    annotations = {keys.node_register("nvidia"): '[{"id":"GPU-a","count":10,"health":true}]'}
    if case["value"] is not None:
        annotations[keys.NVIDIA_HANDSHAKE] = case["value"]
    # Go's CheckHealth reads status.allocatable only; without capacity, this project's
    # "kubelet says no" rule stays out of the comparison (it is §2's own, and stricter).
    allocatable = {"nvidia.com/gpu": str(case["allocatable"])}
    return {
        "metadata": {"name": "go-node", "resourceVersion": "1", "annotations": annotations},
        "status": {"allocatable": allocatable},
    }


@pytest.mark.parametrize("case", _cases("handshake"))
def test_handshake_health_and_patch_as_go_decides(case: dict[str, Any]) -> None:
    """Go's CheckHealth (healthy, need_update and the patch it writes) against this
    scheduler's pass over a node run by Go HAMi's plugin (no Reported ever)."""
    now = _now(case)
    cluster = Cluster([DeviceKind.from_backend(FakeBackend())])
    cluster.upsert_node(_handshake_node(case), now)
    writes, _changes = cluster.refresh(now)
    available = cluster.nodes["go-node"].types["nvidia"].available
    patch = writes[0].annotations if writes else {}
    ours = (available, keys.NVIDIA_HANDSHAKE in patch)
    go = case["go"]
    agrees = ours == (go["healthy"], go["need_update"])
    _judge("handshake", case, agrees, f"ours (available, patch) {ours}, Go {go}")
    if go["need_update"] and ours[1]:
        # The same key and value: Requesting_ in Go's layout, in UTC.
        expected = json.loads(go["patch"])["metadata"]["annotations"]
        assert {keys.NVIDIA_HANDSHAKE: patch[keys.NVIDIA_HANDSHAKE]} == expected
    # Go's NVIDIA first pass re-stamps every Requesting while kubelet advertises the type
    # (need_update); §2 never refreshes a stamp, so only health is compared with it.
    if case["name"] not in DELIBERATE["handshake"]:
        assert available == case["go_nvidia_first_pass"]["healthy"]


# --------------------------------------------------------------------------- node lock


def _go_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")[:19] + "+00:00")


@pytest.mark.parametrize("case", _cases("node_lock_parse"))
def test_node_lock_reads_as_go_reads_it(case: dict[str, Any]) -> None:
    lock = parse_lock(case["value"])
    go = case["go"]
    # A lock Go refuses must be refused (malformed, so stale) here too.
    ours = (lock.time.replace(microsecond=0), lock.namespace, lock.pod) if lock else None
    expected = (_go_time(go["time_utc"]), go["namespace"], go["pod"]) if go["ok"] else None
    _judge("node_lock_parse", case, ours == expected, f"ours {lock}, Go {go}")


@pytest.mark.parametrize("case", _cases("node_lock_generate"))
def test_node_lock_go_writes_reads_back_and_ours_reads_in_go(case: dict[str, Any]) -> None:
    lock = parse_lock(case["value"])
    go = case["go"]
    assert lock is not None
    when = _go_time(go["time_utc"])
    agrees = (lock.time, lock.namespace, lock.pod) == (when, case["namespace"], case["pod"])
    _judge("node_lock_generate", case, agrees, f"ours {lock}")
    # Our writer's form is Go's zone-0 form exactly, which Go read back as recorded.
    if case["zone_offset_s"] == 0:
        assert f"{rfc3339(when)},{case['namespace']},{case['pod']}" == case["value"]
        assert lock.encode() == case["value"]
