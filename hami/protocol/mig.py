"""NVIDIA MIG values of Go HAMi 2.10's dynamic MIG mode (protocol.md section 10).

Three things travel: a MIG GPU's capability inside the JSON register value (``mode: "mig"``
and ``migProfiles``, read and written by :mod:`hami.protocol.register` with the types
here), the scheduler's reservation in the pod annotation ``hami.io/vgpu-mig-allocations``
(:func:`decode_mig_allocations`, :func:`encode_mig_allocations`), and the node's profile
allow-list (:func:`validate_mig_profile_allowlist`). :func:`select_mig_profile` is Go's
choice of profile and placement for a memory request, in Go's order. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.protocol._gojson import MinusZero, fold_key, parse_int_literal
from hami.protocol._ints import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, UINT32_MAX
from hami.protocol.errors import ProtocolError
from hami.protocol.keys import MIG_ALLOCATIONS

MIG_ALLOCATIONS_KEY = MIG_ALLOCATIONS
MIG_MODE = "mig"  # a register device's ``mode`` on a GPU in dynamic MIG mode

_WHAT = f"pod annotation {MIG_ALLOCATIONS_KEY}"
_FIX = (
    "; the scheduler writes this value and the node agent completes it: remove the "
    "annotation (or the pod) and let the pod be scheduled again"
)


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """A GPU instance's place on the GPU: ``size`` memory slices from slice ``start``
    (Go's ``device.MigPlacement``; both unsigned 32-bit)."""

    start: int
    size: int


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile a MIG GPU offers (Go's ``device.MigProfile``): its name
    (``3g.40gb``), memory in MiB, cores as a percent of the whole GPU, memory slices, and
    every legal placement NVML reports for it."""

    name: str
    memory_mb: int
    core: int
    slice_count: int
    placements: tuple[MigPlacement, ...] = ()


@dataclass(frozen=True, slots=True)
class MigAllocation:
    """One reserved MIG device of a pod (an item of ``hami.io/vgpu-mig-allocations``).

    The scheduler sets the first five fields; the node agent that realises the instance adds
    ``mig_uuid``, ``gpu_instance_id`` and ``compute_instance_id`` (all three or none)."""

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    mig_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class AllowedMigProfiles:
    """One entry of the node's MIG allow-list: GPU models (substrings of the model name)
    and the profile names the scheduler may use on them (Go's ``AllowedMigProfiles``)."""

    models: tuple[str, ...]
    profiles: tuple[str, ...]


# --------------------------------------------------------------------------- allow-list


def validate_mig_profile_allowlist(
    entries: Iterable[AllowedMigProfiles | Mapping[str, Any]],
) -> tuple[AllowedMigProfiles, ...]:
    """Check the allow-list by Go's rules and return it typed; ``ValueError`` otherwise.

    Each entry needs models and profiles; a profile name is ``<n>g.<rest>`` (its part before
    the first ``.`` at least two characters, ending in ``g``). Entries may be config mappings
    (``{"models": [...], "profiles": [...]}``)."""
    out: list[AllowedMigProfiles] = []
    for position, entry in enumerate(entries):
        allowed = entry if isinstance(entry, AllowedMigProfiles) else _allowed(entry, position)
        if not allowed.models or not allowed.profiles:
            raise ValueError(
                f"MIG profile allow-list entry {position} must name models and profiles"
            )
        for name in allowed.profiles:
            head, dot, _rest = name.partition(".")
            if not dot or len(head) < 2 or not head.endswith("g"):
                raise ValueError(
                    f"invalid MIG profile {name!r} in allow-list entry {position}: "
                    "expected <slices>g.<memory>, such as 1g.10gb"
                )
        out.append(allowed)
    return tuple(out)


def _allowed(entry: Mapping[str, Any], position: int) -> AllowedMigProfiles:
    if not isinstance(entry, Mapping):
        raise ValueError(f"MIG profile allow-list entry {position} is not a mapping")
    lists: list[tuple[str, ...]] = []
    for field in ("models", "profiles"):
        raw = entry.get(field) or []
        if not isinstance(raw, list | tuple) or not all(isinstance(x, str) for x in raw):
            raise ValueError(
                f"MIG profile allow-list entry {position}: {field} must be a list of strings"
            )
        lists.append(tuple(raw))
    return AllowedMigProfiles(models=lists[0], profiles=lists[1])


def allowed_profiles_for_model(
    allowlist: Iterable[AllowedMigProfiles], model: str
) -> tuple[str, ...]:
    """The profile names the first entry naming ``model`` allows (an entry names a model
    when one of its models is a substring of it, as Go matches); none when no entry does."""
    for allowed in allowlist:
        if any(m in model for m in allowed.models):
            return allowed.profiles
    return ()


def profile_slice_key(name: str) -> str:
    """``3g`` for ``3g.40gb``: the part NVML's profile ids are chosen by."""
    head, dot, _rest = name.partition(".")
    return head if dot and head else name


# --------------------------------------------------------------------------- choice


def placements_overlap(a: MigPlacement, b: MigPlacement) -> bool:
    """Whether two placements share a memory slice (unsigned 32-bit sums, as Go's)."""
    return a.start < (b.start + b.size) & UINT32_MAX and b.start < (a.start + a.size) & UINT32_MAX


def ordered_placements(name: str, placements: Sequence[MigPlacement]) -> list[MigPlacement]:
    """Go's search order: 1g and 3g profiles from the highest start down, the others from
    the lowest up (stable: equal starts keep NVML's order)."""
    high_first = name.startswith(("1g.", "3g."))
    return sorted(placements, key=lambda p: p.start, reverse=high_first)


def select_mig_placement(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], name: str
) -> MigPlacement | None:
    """The first placement of the profile named ``name`` (the first so named) in Go's order
    that overlaps no occupied placement."""
    profile = next((p for p in profiles if p.name == name), None)
    if profile is None:
        return None
    for candidate in ordered_placements(name, profile.placements):
        if not any(placements_overlap(candidate, taken) for taken in occupied):
            return candidate
    return None


def select_mig_profile(
    profiles: Sequence[MigProfile], occupied: Sequence[MigPlacement], memory_mb: int
) -> tuple[MigProfile, MigPlacement] | None:
    """Go HAMi's choice for a request of ``memory_mb`` MiB on one MIG GPU: the profiles by
    memory, then slices (stable), the first with at least that memory and a placement free
    of ``occupied``; ``None`` when none fits."""
    for profile in sorted(profiles, key=lambda p: (p.memory_mb, p.slice_count)):
        if profile.memory_mb < memory_mb:
            continue
        placement = select_mig_placement(profiles, occupied, profile.name)
        if placement is not None:
            return profile, placement
    return None


# --------------------------------------------------------------------------- writer

# Go's encoding/json escapes these besides what every JSON writer escapes.
_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}
_GO_ESCAPES |= {"\u2028": "\\u2028", "\u2029": "\\u2029"}
_GO_ESCAPED = re.compile("[<>&\u2028\u2029]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # not UTF-8: Go writes (and reads) U+FFFD


def go_string(text: str) -> str:
    """``text`` as Go's ``json.Marshal`` writes a string."""
    quoted = json.dumps(_SURROGATE.sub("\ufffd", text), ensure_ascii=False)
    return _GO_ESCAPED.sub(lambda m: _GO_ESCAPES[m.group(0)], quoted)


def encode_placement(placement: MigPlacement) -> str:
    _check_range("placement start", placement.start, 0, UINT32_MAX)
    _check_range("placement size", placement.size, 0, UINT32_MAX)
    return f'{{"start":{placement.start},"size":{placement.size}}}'


def encode_mig_profile(profile: MigProfile) -> str:
    """One profile as Go writes it in a register value; no placements is ``null`` (Go's
    device plugin holds a nil list then)."""
    _check_range("memoryMB", profile.memory_mb, INT32_MIN, INT32_MAX)
    _check_range("core", profile.core, INT32_MIN, INT32_MAX)
    _check_range("sliceCount", profile.slice_count, 0, UINT32_MAX)
    placements = ",".join(encode_placement(p) for p in profile.placements)
    return (
        f'{{"name":{go_string(profile.name)},"memoryMB":{profile.memory_mb},'
        f'"core":{profile.core},"sliceCount":{profile.slice_count},'
        f'"placements":{f"[{placements}]" if profile.placements else "null"}}}'
    )


def encode_mig_allocations(allocations: Iterable[MigAllocation]) -> str:
    """The ``hami.io/vgpu-mig-allocations`` value, byte for byte Go's ``json.Marshal`` of
    its ``[]MigAllocation`` (``[]`` for none; Go's scheduler then writes no annotation)."""
    items = []
    for a in allocations:
        _check_range("containerIndex", a.container_index, 0, INT64_MAX)
        _check_range("deviceIndex", a.device_index, 0, INT64_MAX)
        fields = [
            f'"containerIndex":{a.container_index}',
            f'"deviceIndex":{a.device_index}',
            f'"gpuUUID":{go_string(a.gpu_uuid)}',
            f'"profile":{go_string(a.profile)}',
            f'"placement":{encode_placement(a.placement)}',
        ]
        if a.mig_uuid:
            fields.append(f'"migUUID":{go_string(a.mig_uuid)}')
        for key, number in (
            ("gpuInstanceID", a.gpu_instance_id),
            ("computeInstanceID", a.compute_instance_id),
        ):
            if number is not None:
                _check_range(key, number, 0, UINT32_MAX)
                fields.append(f'"{key}":{number}')
        items.append("{" + ",".join(fields) + "}")
    return "[" + ",".join(items) + "]"


def _check_range(field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ProtocolError("MIG value", f"{field} is outside {low}..{high}", str(value))


# --------------------------------------------------------------------------- reader


class _Pairs(list[tuple[str, Any]]):
    """A JSON object with its keys in order, duplicates kept."""


def _fields(raw: Any, where: str, known: Iterable[str]) -> dict[str, Any]:
    """An object's known keys as Go's encoding/json matches them: ignoring case, the
    last one winning, unknown keys ignored; ``null`` is an object with no keys."""
    if raw is None:
        return {}
    if not isinstance(raw, _Pairs):
        raise ValueError(f"{where} is not a JSON object")
    wanted = set(known)
    out: dict[str, Any] = {}
    for name, value in raw:
        folded = fold_key(name)
        if folded in wanted:
            out[folded] = value
    return out


def _int(raw: Any, where: str, low: int, high: int) -> int:
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"{where} is not an integer")
    if isinstance(raw, MinusZero):
        if low == 0:
            raise ValueError(f"{where} is -0, not an unsigned integer")
        return 0
    if not low <= raw <= high:
        raise ValueError(f"{where} is outside {low}..{high}")
    return raw


def _str(raw: Any, where: str) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise ValueError(f"{where} is not a string")
    return _SURROGATE.sub("\ufffd", raw)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_KEYS = (
    "containerindex",
    "deviceindex",
    "gpuuuid",
    "profile",
    "placement",
    "miguuid",
    "gpuinstanceid",
    "computeinstanceid",
)


def _placement(raw: Any, where: str) -> MigPlacement:
    got = _fields(raw, where, ("start", "size"))
    return MigPlacement(
        start=_int(got.get("start"), f"{where}.start", 0, UINT32_MAX),
        size=_int(got.get("size"), f"{where}.size", 0, UINT32_MAX),
    )


def _allocation(raw: Any, i: int) -> MigAllocation:
    where = f"item {i}"
    got = _fields(raw, where, _KEYS)
    ids = [
        None if got.get(key) is None else _int(got[key], f"{where}.{name}", 0, UINT32_MAX)
        for key, name in (
            ("gpuinstanceid", "gpuInstanceID"),
            ("computeinstanceid", "computeInstanceID"),
        )
    ]
    return MigAllocation(
        container_index=_int(got.get("containerindex"), f"{where}.containerIndex", *_I64),
        device_index=_int(got.get("deviceindex"), f"{where}.deviceIndex", *_I64),
        gpu_uuid=_str(got.get("gpuuuid"), f"{where}.gpuUUID"),
        profile=_str(got.get("profile"), f"{where}.profile"),
        placement=_placement(got.get("placement"), f"{where}.placement"),
        mig_uuid=_str(got.get("miguuid"), f"{where}.migUUID"),
        gpu_instance_id=ids[0],
        compute_instance_id=ids[1],
    )


_I64 = (INT64_MIN, INT64_MAX)


def decode_mig_allocations(value: str) -> list[MigAllocation]:
    """Read ``hami.io/vgpu-mig-allocations`` with Go HAMi's rules (``""`` and ``null`` are
    none). Anything malformed, incomplete (no GPU, profile or placement size, a negative
    index), with a partial runtime identity or a repeated (container, device) pair raises
    :class:`ProtocolError` naming the key; nothing else is raised."""
    if value == "":
        return []
    try:
        items = json.loads(
            value,
            object_pairs_hook=_Pairs,
            parse_constant=_no_constant,
            parse_int=parse_int_literal,
        )
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(_WHAT, f"invalid JSON ({exc}){_FIX}", value) from None
    if items is None:
        return []
    if isinstance(items, _Pairs) or not isinstance(items, list):
        raise ProtocolError(_WHAT, f"not a JSON array{_FIX}", value)
    try:
        out = [_allocation(item, i) for i, item in enumerate(items)]
    except ValueError as exc:
        raise ProtocolError(_WHAT, f"{exc}{_FIX}", value) from None
    seen: set[tuple[int, int]] = set()
    for i, a in enumerate(out):
        problem = _problem(a, seen)
        if problem:
            raise ProtocolError(_WHAT, f"MIG allocation {i} {problem}{_FIX}", value)
    return out


def _problem(a: MigAllocation, seen: set[tuple[int, int]]) -> str:
    if a.container_index < 0 or a.device_index < 0:
        return "is incomplete (a negative containerIndex or deviceIndex)"
    if not a.gpu_uuid or not a.profile or a.placement.size == 0:
        return "is incomplete (no gpuUUID, profile or placement size)"
    runtime = (bool(a.mig_uuid), a.gpu_instance_id is not None, a.compute_instance_id is not None)
    if any(runtime) and not all(runtime):
        return "has a partial runtime identity (migUUID, gpuInstanceID, computeInstanceID)"
    key = (a.container_index, a.device_index)
    if key in seen:
        return f"repeats container {key[0]} device {key[1]}"
    seen.add(key)
    return ""


def occupied_placements(allocations: Iterable[MigAllocation]) -> list[MigPlacement]:
    """The placements a GPU's reservations hold, for :func:`select_mig_profile`."""
    return [a.placement for a in allocations]
