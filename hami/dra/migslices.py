"""MIG GPUs as partitionable DRA devices (``DRAPartitionableDevices``, beta and on by
default in Kubernetes 1.36). Pure.

A GPU the NVIDIA backend serves in ``operating_mode: mig`` (its ``Device.mig`` is set) is not
published as one shared device. Instead:

- one **counter set** per GPU, ``{type}-{index}-mig``, with one counter per memory slice,
  ``memory-slice-{i}`` = 1;
- one **device** per (allowed profile, legal placement), ``{type}-{index}-mig-{profile}-{start}``
  (``nvidia-0-mig-3g-20gb-4``), consuming 1 of every memory slice its placement covers.

Two placements may both be allocated exactly when they share no memory slice, which is
NVIDIA's placement rule, so kube-scheduler can only ever pick a legal layout, and any legal
layout is allocatable. NVML's other limits need no counter for the profiles this project
creates (the plain ``1g``..``7g`` GPU instance profiles): their instance count is the most
disjoint placements they have, and no disjoint set exceeds the GPU's compute slices
(tests/test_dra_migslices.py proves both over the profile tables). The 7g profile is the
whole GPU: its device consumes every slice. A GPU in MIG mode runs CUDA only inside an
instance, so there is no other "whole GPU" device.

An unhealthy MIG GPU stays in the pool: each of its partitions carries the
``hami.io/unhealthy`` device taint (``hami.dra.taints``), as a shared GPU does, so no new
claim gets it and claims already on it keep running; where the API server does not serve
taints (``with_taints=False``) it leaves the pool instead.

API limits (``k8s.io/api/resource/v1``): a slice holds either devices or counter sets, at
most 64 devices when any consumes counters and at most 8 counter sets; so the pool is cut
into as many slices as that takes, all with one generation and ``resourceSliceCount``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.backends.base import Backend, Device
from hami.core.requests import parse_quantity
from hami.dra import names, taints
from hami.dra.attributes import detail_attributes
from hami.dra.slices import device_entry, resource_slice
from hami.protocol.mig import MigPlacement, MigProfile, ordered_placements

JSON = dict[str, Any]
MAX_DEVICES = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures (devices consuming counters)
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets
MAX_COUNTERS = 32  # ResourceSliceMaxCountersPerCounterSet
DNS_LABEL = 63
PROFILE = names.MIG_PROFILE
START = "migStart"
SIZE = "migSize"
COMPUTE_SLICES = "migComputeSlices"


@dataclass(frozen=True, slots=True)
class Partition:
    """One publishable MIG instance: a profile at a legal placement of one GPU."""

    name: str  # the device's name in the slice
    gpu: Device
    profile: MigProfile
    placement: MigPlacement

    @property
    def slices(self) -> range:
        return range(self.placement.start, self.placement.start + self.placement.size)


def partitioned(devices: Sequence[Device]) -> bool:
    """Whether any device is a MIG GPU (the pool is then published as partitions)."""
    return any(d.mig is not None for d in devices)


def counter_set_name(type_word: str, index: int) -> str:
    return f"{type_word.lower()}-{index}-mig"


def slice_counter(i: int) -> str:
    return f"memory-slice-{i}"


def _slug(profile: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", profile.lower()).strip("-")


def gpu_partitions(type_word: str, gpu: Device) -> list[Partition]:
    """Every (profile, placement) of one MIG GPU, named uniquely. A profile whose name makes
    no usable label (or repeats another's) is named by its position instead; placements
    past the counters one set may hold are left out (no GPU has that many slices)."""
    if gpu.mig is None:
        return []
    out: list[Partition] = []
    seen: set[str] = set()
    for position, profile in enumerate(gpu.mig.profiles):
        prefix = f"{type_word.lower()}-{gpu.index}-mig-"
        slug = _slug(profile.name)
        if not slug or len(prefix + slug) + 4 > DNS_LABEL or slug in seen:
            slug = f"p{position}"
        seen.add(slug)
        # Go HAMi's search order (1g and 3g from the highest start): kube-scheduler takes
        # the first free device in slice order, and this order leaves room for the rest
        for placement in ordered_placements(profile.name, profile.placements):
            if placement.size < 1 or placement.start + placement.size > MAX_COUNTERS:
                continue
            name = f"{prefix}{slug}-{placement.start}"
            out.append(Partition(name, gpu, profile, placement))
    return out


def partitions(type_word: str, devices: Sequence[Device]) -> dict[str, Partition]:
    """Every partition of the MIG GPUs among ``devices`` (healthy or not: a prepared claim
    is answered whatever the GPU's health now), by device name."""
    return {p.name: p for d in devices for p in gpu_partitions(type_word, d)}


def counter_set(type_word: str, gpu: Device) -> JSON:
    used = {s for p in gpu_partitions(type_word, gpu) for s in p.slices}
    return {
        "name": counter_set_name(type_word, gpu.index),
        "counters": {slice_counter(i): {"value": "1"} for i in sorted(used)},
    }


def partition_entry(backend: Backend, partition: Partition) -> JSON:
    """One partition as a slice device: the GPU's attributes, the profile's, its memory and
    cores as capacity (for CEL), the memory slices it takes, and the GPU's taints."""
    gpu, profile = partition.gpu, partition.profile
    entry: JSON = {
        "name": partition.name,
        "attributes": {
            "uuid": {"string": gpu.uuid},
            "model": {"string": gpu.model},
            "type": {"string": backend.type_word},
            "vendor": {"string": backend.vendor_word},
            "numa": {"int": gpu.numa},
            "index": {"int": gpu.index},
            "healthy": {"bool": gpu.healthy},
            PROFILE: {"string": profile.name},
            START: {"int": partition.placement.start},
            SIZE: {"int": partition.placement.size},
            COMPUTE_SLICES: {"int": profile.slice_count},
            **detail_attributes(gpu.details),
        },
        "capacity": {
            "memory": {"value": f"{profile.memory_mb}Mi"},
            "cores": {"value": str(profile.core)},
        },
        "consumesCounters": [
            {
                "counterSet": counter_set_name(backend.type_word, gpu.index),
                "counters": {slice_counter(i): {"value": "1"} for i in partition.slices},
            }
        ],
    }
    gpu_taints = taints.device_taints(gpu)
    if gpu_taints:
        entry["taints"] = gpu_taints
    return entry


def _chunks(items: list[JSON], size: int) -> list[list[JSON]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


def extra_slice_name(node: str, type_word: str, part: str) -> str:
    return f"{names.slice_name(node, type_word)}-{part}"


def pool_slices(
    node: str,
    backend: Backend,
    devices: Sequence[Device],
    generation: int = 0,
    *,
    with_taints: bool = True,
) -> list[JSON]:
    """Every ResourceSlice of the pool: device slices first (the first keeps the one-slice
    name), then counter slices. Unhealthy devices are tainted, or, with
    ``with_taints=False``, left out, as in ``hami.dra.slices``."""
    ordered = sorted(devices, key=lambda d: d.index)
    shown = ordered if with_taints else [d for d in ordered if d.healthy]
    entries: list[JSON] = []
    sets: list[JSON] = []
    for device in shown:
        if device.mig is None:
            entries.append(device_entry(backend, device))
            continue
        entries.extend(
            partition_entry(backend, p) for p in gpu_partitions(backend.type_word, device)
        )
        sets.append(counter_set(backend.type_word, device))
    device_chunks = _chunks(entries, MAX_DEVICES)
    set_chunks = [sets[i : i + MAX_COUNTER_SETS] for i in range(0, len(sets), MAX_COUNTER_SETS)]
    count = len(device_chunks) + len(set_chunks)
    out: list[JSON] = []
    for i, chunk in enumerate(device_chunks):
        body = resource_slice(node, backend, [], generation)
        if i:
            body["metadata"]["name"] = extra_slice_name(node, backend.type_word, str(i + 1))
        body["spec"]["devices"] = chunk
        out.append(body)
    for i, chunk in enumerate(set_chunks):
        body = resource_slice(node, backend, [], generation)
        body["metadata"]["name"] = extra_slice_name(node, backend.type_word, f"counters-{i + 1}")
        del body["spec"]["devices"]
        body["spec"]["sharedCounters"] = chunk
        out.append(body)
    for body in out:
        body["spec"]["pool"]["resourceSliceCount"] = count
    return out


def _canonical(value: Any) -> Any:
    """Quantities by value (the API server writes ``40960Mi`` back as ``40Gi``)."""
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, str):
        try:
            return parse_quantity(value)
        except ValueError:
            return value
    return value


def same_spec(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two slice specs say the same, the pool generation and the time the API
    server stamps on a taint aside."""

    def strip(spec: Mapping[str, Any]) -> Any:
        out = dict(spec)
        pool = dict(out.get("pool") or {})
        pool.pop("generation", None)
        out["pool"] = pool
        if isinstance(out.get("devices"), list):
            out["devices"] = [
                taints.without_times(d) if isinstance(d, Mapping) else d for d in out["devices"]
            ]
        return _canonical(out)

    return bool(strip(old) == strip(new))


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """What to write to make the API server's slices say what the devices say."""

    create: list[JSON]
    replace: list[JSON]
    delete: list[str]
    generation: int

    @property
    def empty(self) -> bool:
        return not (self.create or self.replace or self.delete)


def plan_pool(
    node: str,
    backend: Backend,
    devices: Sequence[Device],
    existing: Mapping[str, Mapping[str, Any] | None],
    *,
    with_taints: bool = True,
) -> PoolPlan:
    """``existing``: slice name -> the slice the API server has (None: absent), for every
    name the pool has or had. Nothing to write when every desired slice is there as
    desired and no other is; otherwise every desired slice is written with the generation
    bumped past all existing ones (consumers read only a pool's newest generation) and the
    others deleted. A taint already there keeps the time the API server gave it."""
    desired = pool_slices(node, backend, devices, 0, with_taints=with_taints)
    wanted = {b["metadata"]["name"] for b in desired}
    present = {n: s for n, s in existing.items() if s is not None}
    stale = sorted(set(present) - wanted)
    unchanged = all(
        b["metadata"]["name"] in present
        and same_spec(present[b["metadata"]["name"]].get("spec") or {}, b["spec"])
        for b in desired
    )
    if unchanged and not stale:
        return PoolPlan([], [], [], _generation(present.values()))
    generation = _generation(present.values()) + (1 if present else 0)
    create: list[JSON] = []
    replace: list[JSON] = []
    for body in desired:
        body["spec"]["pool"]["generation"] = generation
        old = present.get(body["metadata"]["name"])
        if old is None:
            create.append(body)
            continue
        version = (old.get("metadata") or {}).get("resourceVersion")
        if version:
            body["metadata"]["resourceVersion"] = version
        old_devices = (old.get("spec") or {}).get("devices")
        if isinstance(old_devices, list) and "devices" in body["spec"]:
            taints.keep_times(body["spec"]["devices"], old_devices)
        replace.append(body)
    return PoolPlan(create, replace, stale, generation)


def _generation(found: Any) -> int:
    best = 0
    for body in found:
        value = ((body.get("spec") or {}).get("pool") or {}).get("generation")
        if isinstance(value, int) and not isinstance(value, bool):
            best = max(best, value)
    return best
