"""hami.protocol.mig (issue 23 item 6): the MIG reservation codec, the register's MIG
profiles and Go's choice of profile and placement, by example and by Hypothesis.

The Go-made vectors are tests/test_mig_go_vectors.py; here the properties: decoding
untrusted values raises only ProtocolError naming the key, and the code that *uses* decoded
values (the choice, the writers) never raises and never yields an illegal layout.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.protocol import ProtocolError, decode_node_devices
from hami.protocol.mig import (
    MIG_ALLOCATIONS_KEY,
    AllowedMigProfiles,
    MigAllocation,
    MigPlacement,
    MigProfile,
    allowed_profiles_for_model,
    decode_mig_allocations,
    encode_mig_allocations,
    occupied_placements,
    ordered_placements,
    placements_overlap,
    profile_slice_key,
    select_mig_profile,
    validate_mig_profile_allowlist,
)
from hami.protocol.register import NodeDevice, encode_node_devices_json

UINT32 = 2**32 - 1


def _places(starts: range | list[int], size: int) -> tuple[MigPlacement, ...]:
    return tuple(MigPlacement(s, size) for s in starts)


# A100 40GB as NVIDIA's MIG user guide lays it out: 8 memory slices, 7 compute slices.
A100_40 = (
    MigProfile("1g.5gb", 4864, 15, 1, _places(range(7), 1)),
    MigProfile("2g.10gb", 9856, 29, 2, _places([0, 2, 4], 2)),
    MigProfile("3g.20gb", 19968, 43, 3, _places([0, 4], 4)),
    MigProfile("4g.20gb", 19968, 58, 4, _places([0], 4)),
    MigProfile("7g.40gb", 40192, 100, 7, _places([0], 8)),
)


# --------------------------------------------------------------------------- by example


def test_the_smallest_profile_with_a_free_placement_wins() -> None:
    assert select_mig_profile(A100_40, [], 1) == (A100_40[0], MigPlacement(6, 1))
    assert select_mig_profile(A100_40, [], 5000) == (A100_40[1], MigPlacement(0, 2))
    # Equal memory: fewer slices first (3g before 4g); 3g searches from the top.
    assert select_mig_profile(A100_40, [], 19968) == (A100_40[2], MigPlacement(4, 4))
    assert select_mig_profile(A100_40, [], 40193) is None


def test_a_full_profile_falls_through_to_a_larger_one() -> None:
    occupied = [MigPlacement(4, 4)]  # a 3g.20gb at the top
    # 2g.10gb from the bottom; then 3g.20gb only at 0; 4g.20gb overlaps nothing else.
    assert select_mig_profile(A100_40, occupied, 9000) == (A100_40[1], MigPlacement(0, 2))
    assert select_mig_profile(A100_40, occupied, 19000) == (A100_40[2], MigPlacement(0, 4))
    occupied.append(MigPlacement(0, 4))
    assert select_mig_profile(A100_40, occupied, 1) is None


def test_placement_order_depends_on_the_profile() -> None:
    places = _places([2, 0, 4], 2)
    assert [p.start for p in ordered_placements("1g.10gb", places)] == [4, 2, 0]
    assert [p.start for p in ordered_placements("3g.40gb", places)] == [4, 2, 0]
    assert [p.start for p in ordered_placements("2g.20gb", places)] == [0, 2, 4]
    assert [p.start for p in ordered_placements("1g", places)] == [0, 2, 4]  # no "1g."


def test_overlap_uses_unsigned_32_bit_sums() -> None:
    assert placements_overlap(MigPlacement(0, 2), MigPlacement(1, 1))
    assert not placements_overlap(MigPlacement(0, 2), MigPlacement(2, 2))
    # Go's start+size wraps: an instance at the top of the range overlaps nothing below.
    assert not placements_overlap(MigPlacement(0, 1), MigPlacement(UINT32, 2))


def test_allocations_round_trip_in_go_form() -> None:
    reserved = MigAllocation(0, 1, "GPU-a", "3g.40gb", MigPlacement(4, 4))
    realised = MigAllocation(1, 0, "GPU-a", "1g.10gb", MigPlacement(0, 1), "MIG-x", 0, 0)
    value = encode_mig_allocations([reserved, realised])
    assert value == (
        '[{"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-a","profile":"3g.40gb",'
        '"placement":{"start":4,"size":4}},'
        '{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.10gb",'
        '"placement":{"start":0,"size":1},"migUUID":"MIG-x","gpuInstanceID":0,'
        '"computeInstanceID":0}]'
    )
    assert decode_mig_allocations(value) == [reserved, realised]
    assert occupied_placements([reserved, realised]) == [MigPlacement(4, 4), MigPlacement(0, 1)]
    assert decode_mig_allocations("") == decode_mig_allocations("null") == []
    assert encode_mig_allocations([]) == "[]"


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ("{", "invalid JSON"),
        ('{"containerIndex":0}', "not a JSON array"),
        ('[{"containerIndex":"0"}]', "containerIndex is not an integer"),
        ("[{}]", "is incomplete"),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g","profile":"1g",'
            '"placement":{"start":0,"size":1},"migUUID":"m"}]',
            "partial runtime identity",
        ),
    ],
)
def test_malformed_allocations_name_the_key_and_the_fix(value: str, detail: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_mig_allocations(value)
    message = str(caught.value)
    assert MIG_ALLOCATIONS_KEY in message and detail in message
    assert "remove the annotation" in message


def test_register_carries_mig_profiles_both_ways() -> None:
    device = NodeDevice("GPU-m", 7, 40960, 100, "NVIDIA-A100-SXM4-40GB", 0, True, 0, "mig", A100_40)
    value = encode_node_devices_json([device])
    assert '"mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,' in value
    assert decode_node_devices(value) == [device]
    bare = NodeDevice(
        "GPU-m", 7, 40960, 100, "x", 0, True, 0, "mig", (MigProfile("1g.x", 1, 1, 1),)
    )
    assert '"placements":null' in encode_node_devices_json([bare])
    negative = NodeDevice("GPU-m", 7, 1, 1, "x", 0, True, 0, "mig", (MigProfile("1g.x", -1, 1, 1),))
    with pytest.raises(ProtocolError):
        encode_node_devices_json([negative])


def test_allowlist_rules_and_model_match() -> None:
    allowed = validate_mig_profile_allowlist(
        [{"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "7g.40gb"]}]
    )
    assert allowed == (AllowedMigProfiles(("A100-SXM4-40GB",), ("1g.5gb", "7g.40gb")),)
    assert allowed_profiles_for_model(allowed, "NVIDIA A100-SXM4-40GB") == ("1g.5gb", "7g.40gb")
    assert allowed_profiles_for_model(allowed, "NVIDIA H100") == ()
    assert profile_slice_key("3g.40gb") == "3g" and profile_slice_key("7g") == "7g"
    for bad in ([{"models": "A100", "profiles": ["1g.5gb"]}], ["x"], [{"models": ["A"]}]):
        with pytest.raises(ValueError):
            validate_mig_profile_allowlist(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Hypothesis

u32 = st.one_of(st.integers(0, 9), st.sampled_from([UINT32, UINT32 - 1, 2**31]))
placements = st.builds(MigPlacement, u32, u32)
names = st.sampled_from(["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "x"])
profiles = st.builds(
    MigProfile,
    names,
    st.integers(0, 50_000),
    st.integers(0, 100),
    st.integers(0, 8),
    st.lists(placements, max_size=8).map(tuple),
)
memory = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(0, 50_000))


def _reference(
    offered: list[MigProfile], occupied: list[MigPlacement], request: int
) -> tuple[MigProfile, MigPlacement] | None:
    """Go's rule written again, differently: every (profile, placement) pair that is legal,
    the first by (memory, slices, list position) then by the placement search order."""

    def free(p: MigPlacement) -> bool:
        return all(
            not (p.start < (o.start + o.size) % 2**32 and o.start < (p.start + p.size) % 2**32)
            for o in occupied
        )

    ranked = sorted(enumerate(offered), key=lambda ip: (ip[1].memory_mb, ip[1].slice_count, ip[0]))
    for _, profile in ranked:
        if profile.memory_mb < request:
            continue
        first = next(p for p in offered if p.name == profile.name)  # Go looks up by name
        high = first.name[:3] in ("1g.", "3g.")
        order = sorted(range(len(first.placements)), key=lambda i: first.placements[i].start)
        if high:
            order = sorted(
                range(len(first.placements)), key=lambda i: (-first.placements[i].start, i)
            )
        for i in order:
            if free(first.placements[i]):
                return profile, first.placements[i]
    return None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(profiles, max_size=6), st.lists(placements, max_size=6), memory)
def test_choice_is_gos_rule_and_legal(
    offered: list[MigProfile], occupied: list[MigPlacement], request: int
) -> None:
    chosen = select_mig_profile(offered, occupied, request)
    assert chosen == _reference(offered, occupied, request)
    if chosen is not None:
        profile, placement = chosen
        assert profile.memory_mb >= request
        assert not any(placements_overlap(placement, o) for o in occupied)


@settings(max_examples=200)
@given(st.lists(st.integers(0, 41_000), max_size=12))
def test_placing_until_full_never_overlaps(requests: list[int]) -> None:
    occupied: list[MigPlacement] = []
    slices = 0
    for request in requests:
        chosen = select_mig_profile(A100_40, occupied, request)
        if chosen is None:
            continue
        profile, placement = chosen
        assert not any(placements_overlap(placement, o) for o in occupied)
        assert placement in profile.placements and placement.start + placement.size <= 8
        occupied.append(placement)
        slices += placement.size
    assert slices <= 8


allocations = st.builds(
    MigAllocation,
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.text(min_size=1, max_size=8),
    st.text(min_size=1, max_size=8),
    st.builds(MigPlacement, st.integers(0, UINT32), st.integers(1, UINT32)),
)


@given(st.lists(allocations, max_size=4), st.data())
def test_allocations_round_trip(given_list: list[MigAllocation], data: st.DataObject) -> None:
    unique = list({(a.container_index, a.device_index): a for a in given_list}.values())
    realised = [
        MigAllocation(
            a.container_index,
            a.device_index,
            a.gpu_uuid,
            a.profile,
            a.placement,
            data.draw(st.text(min_size=1, max_size=4)),
            data.draw(st.integers(0, UINT32)),
            data.draw(st.integers(0, UINT32)),
        )
        if data.draw(st.booleans())
        else a
        for a in unique
    ]
    value = encode_mig_allocations(realised)
    json.loads(value)
    # Lone surrogates are not UTF-8: written (and read) as U+FFFD, as Go does.
    assert [_plain(a) for a in decode_mig_allocations(value)] == [_plain(a) for a in realised]


def _plain(a: MigAllocation) -> MigAllocation:
    fix = lambda s: "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in s)  # noqa: E731
    return MigAllocation(
        a.container_index,
        a.device_index,
        fix(a.gpu_uuid),
        fix(a.profile),
        a.placement,
        fix(a.mig_uuid),
        a.gpu_instance_id,
        a.compute_instance_id,
    )


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
allocation_keys = st.sampled_from(
    [
        *("containerIndex", "deviceIndex", "gpuUUID", "profile", "placement", "migUUID"),
        *("gpuInstanceID", "computeInstanceID", "start", "size", "CONTAINERINDEX", "x"),
    ]
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(allocation_keys, inner, max_size=8)
    ),
    max_leaves=20,
)


@settings(max_examples=400)
@given(st.one_of(json_values.map(json.dumps), st.text(max_size=40)))
def test_untrusted_allocations_raise_only_protocol_errors(value: str) -> None:
    try:
        decoded = decode_mig_allocations(value)
    except ProtocolError as exc:
        assert MIG_ALLOCATIONS_KEY in str(exc)
        return
    # What decodes is usable: it writes back and reads back the same.
    assert decode_mig_allocations(encode_mig_allocations(decoded)) == decoded
    for a in decoded:
        assert a.container_index >= 0 and a.device_index >= 0 and a.placement.size > 0


mig_profile_json = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(names, json_scalars),
        "memoryMB": st.one_of(st.integers(-5, 50_000), json_scalars),
        "core": st.one_of(st.integers(0, 100), json_scalars),
        "sliceCount": st.one_of(st.integers(0, 8), json_scalars),
        "placements": st.one_of(
            st.none(),
            st.lists(
                st.one_of(
                    st.fixed_dictionaries({"start": u32, "size": u32}),
                    json_values,
                ),
                max_size=8,
            ),
        ),
    },
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.one_of(mig_profile_json, json_values), max_size=5),
    st.lists(st.fixed_dictionaries({"start": u32, "size": u32}), max_size=4),
    memory,
)
def test_decoded_register_profiles_feed_the_choice_safely(
    raw_profiles: list[Any], raw_occupied: list[Any], request: int
) -> None:
    """The register's MIG profiles and a pod's reservations as they come off the wire, then
    used as the scheduler uses them: nothing raises but ProtocolError while decoding."""
    register = json.dumps([{"id": "GPU-a", "mode": "mig", "migProfiles": raw_profiles}])
    reserved = json.dumps(
        [
            {"containerIndex": i, "deviceIndex": 0, "gpuUUID": "GPU-a", "profile": "1g"}
            | {"placement": p}
            for i, p in enumerate(raw_occupied)
        ]
    )
    try:
        (device,) = decode_node_devices(register)
        taken = occupied_placements(decode_mig_allocations(reserved))
    except ProtocolError:
        return
    chosen = select_mig_profile(device.mig_profiles, taken, request)
    assert chosen == _reference(list(device.mig_profiles), taken, request)
    if chosen is not None:
        first = next(p for p in device.mig_profiles if p.name == chosen[0].name)
        assert chosen[0].memory_mb >= request and chosen[1] in first.placements
    # The node's writer writes what was read, and reads back the same.
    assert decode_node_devices(encode_node_devices_json([device])) == [device]
