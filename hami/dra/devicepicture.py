"""Each node's hami devices and what allocated claims hold on them, for ``hami explain``
in DRA mode. Pure.

Capacities and holds are read by ``hami.dra.inventory`` (the DRA score's reader); this
module adds what the explanation also needs from the same objects: the ``uuid`` attribute
(the name a user knows a GPU by), each capacity's request policy (what a request that
names no amount consumes, and the most it may name), whether the device may be shared,
its taints, and which claims hold it. Only the newest generation of each pool counts, as
kube-scheduler reads pools.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.core.requests import parse_quantity
from hami.core.usage import Use
from hami.dra import inventory, names

MIB = inventory.MIB


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


@dataclass(frozen=True, slots=True)
class Amount:
    """One consumable capacity of a device, in MiB for memory."""

    total: int
    default: int  # what a request naming none consumes (no policy: the whole capacity)
    most: int  # the most one request may name (validRange.max, validValues)


@dataclass(frozen=True, slots=True)
class DeviceView:
    node: str
    driver: str
    name: str  # the device's name in the slice (``nvidia-0``): what results name
    uuid: str  # the ``uuid`` attribute, else the name
    model: str
    memory: Amount
    cores: Amount
    slots: Amount
    shared: bool  # allowMultipleAllocations
    taints: tuple[Taint, ...] = ()

    @property
    def label(self) -> str:
        return self.uuid


@dataclass(frozen=True, slots=True)
class PartView:
    """One MIG partition device (``hami.dra.migslices``): a profile at a placement of
    the memory slices of one GPU."""

    node: str
    driver: str
    name: str
    uuid: str  # the GPU's
    profile: str
    start: int
    size: int
    taints: tuple[Taint, ...] = ()

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)


@dataclass(slots=True)
class Held:
    """What allocated claims hold on one device, and which claims."""

    use: Use = field(default_factory=Use)
    claims: list[str] = field(default_factory=list)
    whole: list[str] = field(default_factory=list)  # claims holding it without sharing


@dataclass(frozen=True, slots=True)
class Picture:
    devices: Mapping[str, tuple[DeviceView, ...]]  # node -> its hami devices
    drivers: Mapping[str, frozenset[str]]  # node -> the hami drivers it publishes
    errors: tuple[str, ...] = ()
    # pool -> its node (hami names a pool after its node; another writer may not)
    pools: Mapping[str, str] = field(default_factory=dict)
    partitions: Mapping[str, tuple[PartView, ...]] = field(default_factory=dict)  # by node


_parse_text = functools.lru_cache(maxsize=4096)(parse_quantity)


def _quantity(value: Any) -> int:
    # every device of a pool repeats the same few strings ("40960Mi", "100", "1")
    return _parse_text(value) if isinstance(value, str) else parse_quantity(value)


def _amount(capacity: Mapping[str, Any], name: str, scale: int) -> Amount:
    entry = capacity.get(name)
    entry = entry if isinstance(entry, Mapping) else {}
    total = -(-_quantity(entry.get("value")) // scale)
    policy = entry.get("requestPolicy")
    policy = policy if isinstance(policy, Mapping) else {}
    default = -(-_quantity(policy["default"]) // scale) if "default" in policy else total
    most = total
    valid_range = policy.get("validRange")
    if isinstance(valid_range, Mapping) and valid_range.get("max") is not None:
        most = min(total, _quantity(valid_range["max"]) // scale)
    values = policy.get("validValues")
    if isinstance(values, list) and values:
        most = min(total, max(_quantity(v) // scale for v in values))
    return Amount(total, default, most)


def _taints(entry: Mapping[str, Any], where: str) -> tuple[Taint, ...]:
    raw = entry.get("taints")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"{where}: taints is not a list")
    out: list[Taint] = []
    for i, taint in enumerate(raw):
        if not isinstance(taint, Mapping) or not taint.get("key"):
            raise ValueError(f"{where}: taint {i} has no key")
        out.append(
            Taint(str(taint["key"]), str(taint.get("value") or ""), str(taint.get("effect") or ""))
        )
    return tuple(out)


def _view(node: str, driver: str, entry: Mapping[str, Any], where: str) -> DeviceView:
    name = str(entry["name"])
    at = f"{where} device {name!r}"
    attributes = entry.get("attributes")
    attributes = attributes if isinstance(attributes, Mapping) else {}
    uuid = attributes.get("uuid")
    uuid = uuid.get("string") if isinstance(uuid, Mapping) else None
    model = attributes.get("model")
    model = model.get("string") if isinstance(model, Mapping) else None
    capacity = entry.get("capacity")
    if not isinstance(capacity, Mapping):
        raise ValueError(f"{at}: no capacity")
    try:
        memory = _amount(capacity, "memory", MIB)
        cores = _amount(capacity, "cores", 1)
        slots = _amount(capacity, "slots", 1)
    except (ValueError, ArithmeticError, TypeError, KeyError) as exc:
        raise ValueError(f"{at}: capacity unreadable ({exc})") from None
    return DeviceView(
        node=node,
        driver=driver,
        name=name,
        uuid=str(uuid) if uuid else name,
        model=str(model or ""),
        memory=memory,
        cores=cores,
        slots=slots,
        shared=entry.get("allowMultipleAllocations") is True,
        taints=_taints(entry, at),
    )


def _partition(entry: Any) -> bool:
    attributes = entry.get("attributes") if isinstance(entry, Mapping) else None
    return isinstance(attributes, Mapping) and names.MIG_PROFILE in attributes


def _int(attributes: Mapping[str, Any], name: str) -> int | None:
    value = attributes.get(name)
    value = value.get("int") if isinstance(value, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _part(node: str, driver: str, entry: Mapping[str, Any], where: str) -> PartView:
    name = str(entry.get("name") or "?")
    attributes = entry["attributes"]
    profile = attributes[names.MIG_PROFILE]
    profile = profile.get("string") if isinstance(profile, Mapping) else None
    start, size = _int(attributes, "migStart"), _int(attributes, "migSize")
    if not isinstance(profile, str) or not profile or start is None or size is None:
        raise ValueError(
            f"{where} device {name!r}: MIG partition attributes unreadable "
            "(migProfile string, migStart and migSize ints)"
        )
    if start < 0 or size < 1:
        raise ValueError(f"{where} device {name!r}: MIG placement {start}+{size} is not legal")
    uuid = attributes.get("uuid")
    uuid = uuid.get("string") if isinstance(uuid, Mapping) else None
    return PartView(
        node, driver, name, str(uuid or name), profile, start, size, _taints(entry, where)
    )


def _newest(slices: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The slices of each pool's newest generation (an older one is being replaced)."""
    newest: dict[tuple[str, str], int] = {}
    keyed: list[tuple[tuple[str, str], int, Mapping[str, Any]]] = []
    for obj in slices:
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        pool = spec.get("pool") if isinstance(spec, Mapping) else None
        if not isinstance(spec, Mapping) or not isinstance(pool, Mapping):
            continue
        key = (str(spec.get("driver") or ""), str(pool.get("name") or ""))
        generation = pool.get("generation")
        generation = generation if isinstance(generation, int) else 0
        newest[key] = max(newest.get(key, generation), generation)
        keyed.append((key, generation, obj))
    return [obj for key, generation, obj in keyed if generation == newest[key]]


def picture(slices: Iterable[Mapping[str, Any]], drivers: Mapping[str, str]) -> Picture:
    """The devices of hami's ``drivers`` (driver -> type word) per node. A device that
    cannot be read is left out with an error naming the slice and the device."""
    devices: dict[str, list[DeviceView]] = {}
    published: dict[str, set[str]] = {}
    pools: dict[str, str] = {}
    parts: dict[str, list[PartView]] = {}
    errors: list[str] = []
    for whole in _newest(slices):
        # partitions have no share capacities: inventory would call each unreadable
        entries = whole["spec"].get("devices")
        entries = entries if isinstance(entries, list) else []
        obj = {
            **whole,
            "spec": {**whole["spec"], "devices": [e for e in entries if not _partition(e)]},
        }
        read = inventory.slice_devices(obj, drivers)
        if read is None:
            continue
        where = inventory.object_ref("ResourceSlice", obj)
        errors.extend(read.errors)
        spec = obj["spec"]
        driver = str(spec.get("driver"))
        pools[str(spec["pool"].get("name") or "")] = read.node
        published.setdefault(read.node, set()).add(driver)
        for entry in filter(_partition, entries):
            try:
                parts.setdefault(read.node, []).append(_part(read.node, driver, entry, where))
            except (ValueError, TypeError) as exc:
                errors.append(str(exc))
        readable = {d.uuid for d in read.devices}  # inventory keys devices by their name
        for entry in spec.get("devices") or []:
            if not isinstance(entry, Mapping) or str(entry.get("name")) not in readable:
                continue
            try:
                devices.setdefault(read.node, []).append(_view(read.node, driver, entry, where))
            except ValueError as exc:
                errors.append(str(exc))
    return Picture(
        {node: tuple(views) for node, views in devices.items()},
        {node: frozenset(d) for node, d in published.items()},
        tuple(errors),
        pools,
        {node: tuple(views) for node, views in parts.items()},
    )


def claim_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    return f"{meta.get('namespace') or '?'}/{meta.get('name') or '?'}"


def holds(
    claims: Iterable[Mapping[str, Any]],
    drivers: Mapping[str, str],
    skip: Sequence[str] = (),
    pools: Mapping[str, str] | None = None,
    partitions: Mapping[str, Iterable[PartView]] | None = None,
) -> tuple[dict[str, dict[str, Held]], list[str]]:
    """node -> device name -> what allocated claims hold there (a result's pool is its
    node through ``pools``, else by hami's naming); claims named in ``skip`` (``ns/name``)
    are left out. A result without consumed capacity holds the device whole
    (``inventory``'s rule), and says which claim does; one on a MIG partition
    (``partitions``: node -> its partitions) holds that partition's slices."""
    out: dict[str, dict[str, Held]] = {}
    errors: list[str] = []
    parted = {(p.node, p.name) for views in (partitions or {}).values() for p in views}
    for obj in claims:
        name = claim_name(obj)
        if name in skip:
            continue
        obj = _hold_partitions(obj, name, parted, pools or {}, out)
        read = inventory.claim_holds(obj, drivers)
        errors.extend(read.errors)
        for pool, usage in read.usage.items():
            node = (pools or {}).get(pool, pool)
            for device, use in usage.items():
                held = out.setdefault(node, {}).setdefault(device, Held())
                held.use.add(use)
                held.claims.append(name)
                if use.memory >= inventory.WHOLE_MEMORY:
                    held.whole.append(name)
    return out, errors


def _hold_partitions(
    obj: Mapping[str, Any],
    name: str,
    parted: set[tuple[str, str]],
    pools: Mapping[str, str],
    out: dict[str, dict[str, Held]],
) -> Mapping[str, Any]:
    """Records the claim's results on MIG partitions in ``out``, and gives the claim back
    without them (a partition is taken by its counters, not by consumed capacity)."""
    status = obj.get("status") if isinstance(obj, Mapping) else None
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not (parted and isinstance(results, list) and isinstance(devices, Mapping)):
        return obj
    if not (isinstance(status, Mapping) and isinstance(allocation, Mapping)):
        return obj
    rest: list[Any] = []
    for result in results:
        pool = result.get("pool") if isinstance(result, Mapping) else None
        device = result.get("device") if isinstance(result, Mapping) else None
        node = pools.get(pool, pool) if isinstance(pool, str) else None
        if isinstance(node, str) and (node, device) in parted:
            out.setdefault(node, {}).setdefault(str(device), Held()).claims.append(name)
        else:
            rest.append(result)
    if len(rest) == len(results):
        return obj
    devices = {**devices, "results": rest}
    return {**obj, "status": {**status, "allocation": {**allocation, "devices": devices}}}
