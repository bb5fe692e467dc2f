"""The MIG counter model of the DRA mode (hami.dra.migslices), pure: the sets of partition
devices kube-scheduler can allocate together under the published counters are exactly the
legal MIG layouts (NVIDIA's rules as the fake NVML enforces them: legal placements, no
shared memory slice, at most the profile's instance count, at most the GPU's compute
slices); the pool is cut within the API's limits; a pool is rewritten only on change."""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.backends._nvml_mig import GI_PROFILE_BY_SLICES
from hami.backends.base import Backend, BackendSettings, Device, MigCapability
from hami.backends.fake import FakeBackend
from hami.backends.mig_tables import MIG_PROFILES, GpuInstanceProfile
from hami.dra import migslices
from hami.dra.migslices import Partition
from hami.protocol.mig import MigProfile, placements_overlap, profile_slice_key

TABLES = sorted(MIG_PROFILES)
# the NVML profiles this project creates: a profile name's slice word picks one of them
PLAIN = set(GI_PROFILE_BY_SLICES.values())


def backend() -> Backend:
    return FakeBackend(BackendSettings(options={"type": "nvidia", "vendor": "NVIDIA"}))


BACKEND = backend()


@functools.cache
def nvml_profile(table: str, name: str) -> GpuInstanceProfile:
    """What NVML answers for an allowed name: the plain profile of its slice word."""
    wanted = GI_PROFILE_BY_SLICES[profile_slice_key(name)]
    return next(p for p in MIG_PROFILES[table] if p.profile_id == wanted)


def mig_gpu(table: str, names: Sequence[str], index: int = 0) -> Device:
    """A MIG GPU as the NVIDIA backend enumerates it with ``names`` allowed."""
    profiles = []
    for name in names:
        info = nvml_profile(table, name)
        profiles.append(MigProfile(name, info.memory_mb, 0, info.slice_count, info.placements))
    return Device(
        uuid=f"GPU-{index}",
        index=index,
        model=table,
        memory_mib=81920,
        mig=MigCapability(tuple(profiles), 7),
    )


def plain_names(table: str) -> list[str]:
    return [p.name.removeprefix("MIG ") for p in MIG_PROFILES[table] if p.profile_id in PLAIN]


@functools.cache
def _entry(partition: Partition) -> dict[str, Any]:
    return migslices.partition_entry(BACKEND, partition)


def allocatable(gpu: Device, chosen: Iterable[Partition]) -> bool:
    """kube-scheduler's rule: each device once, and per counter the sum of what the chosen
    devices consume within the counter set's value (every device here is on one GPU)."""
    chosen = list(chosen)
    if len({p.name for p in chosen}) != len(chosen):
        return False
    entries = [_entry(p) for p in chosen]
    (counter_set,) = [migslices.counter_set("nvidia", gpu)]
    available = {k: int(v["value"]) for k, v in counter_set["counters"].items()}
    used: Counter[str] = Counter()
    for entry in entries:
        (consumption,) = entry["consumesCounters"]
        assert consumption["counterSet"] == counter_set["name"]
        for name, value in consumption["counters"].items():
            assert name in available, f"{entry['name']} consumes unknown counter {name}"
            used[name] += int(value["value"])
    return all(used[name] <= available[name] for name in used)


def legal(table: str, chosen: Sequence[Partition]) -> bool:
    """NVIDIA's MIG rules, stated independently of the counters."""
    per_profile: Counter[int] = Counter()
    compute = 0
    for p in chosen:
        info = nvml_profile(table, p.profile.name)
        if p.placement not in info.placements:
            return False
        per_profile[info.profile_id] += 1
        compute += info.slice_count
    full = max(p.slice_count for p in MIG_PROFILES[table])
    if compute > full:
        return False
    if any(n > nvml_profile_by_id(table, pid).instance_count for pid, n in per_profile.items()):
        return False
    return all(
        not placements_overlap(a.placement, b.placement)
        for a, b in itertools.combinations(chosen, 2)
    )


@functools.cache
def nvml_profile_by_id(table: str, profile_id: int) -> GpuInstanceProfile:
    return next(p for p in MIG_PROFILES[table] if p.profile_id == profile_id)


@pytest.mark.parametrize("table", TABLES)
def test_every_subset_is_allocatable_exactly_when_legal(table: str) -> None:
    gpu = mig_gpu(table, plain_names(table))
    parts = migslices.gpu_partitions("nvidia", gpu)
    assert len(parts) == 7 + 3 + 2 + 1 + 1  # 1g, 2g, 3g, 4g, 7g placements
    layouts = 0
    for mask in range(1 << len(parts)):
        chosen = [p for i, p in enumerate(parts) if mask >> i & 1]
        ok = legal(table, chosen)
        assert allocatable(gpu, chosen) == ok, [(p.profile.name, p.placement) for p in chosen]
        layouts += ok
    assert layouts > 100  # many legal layouts, each allocatable


@settings(max_examples=300, deadline=None)
@given(
    table=st.sampled_from(TABLES),
    data=st.data(),
)
def test_any_allow_list_and_any_choice_agree(table: str, data: st.DataObject) -> None:
    """Any allow-list (names of any slice word, the same NVML profile named twice) and any
    multiset of picks: allocatable under the counters exactly when a legal layout."""
    words = data.draw(st.lists(st.sampled_from(["1g", "2g", "3g", "4g", "7g"]), min_size=1))
    names = [f"{w}.{i}gb" for i, w in enumerate(words)]
    gpu = mig_gpu(table, names)
    parts = migslices.gpu_partitions("nvidia", gpu)
    chosen = data.draw(st.lists(st.sampled_from(parts), max_size=9, unique_by=lambda p: p.name))
    assert allocatable(gpu, chosen) == legal(table, chosen)


def test_partitions_name_attributes_and_capacity() -> None:
    gpu = mig_gpu("A100-SXM4-40GB", ["1g.5gb", "3g.20gb", "7g.40gb"], index=3)
    by_name = migslices.partitions("nvidia", [gpu])
    assert sorted(by_name) == sorted(
        [f"nvidia-3-mig-1g-5gb-{s}" for s in range(7)]
        + ["nvidia-3-mig-3g-20gb-0", "nvidia-3-mig-3g-20gb-4", "nvidia-3-mig-7g-40gb-0"]
    )
    entry = migslices.partition_entry(backend(), by_name["nvidia-3-mig-3g-20gb-4"])
    assert entry["attributes"]["migProfile"] == {"string": "3g.20gb"}
    assert entry["attributes"]["migStart"] == {"int": 4}
    assert entry["attributes"]["migSize"] == {"int": 4}
    assert entry["attributes"]["uuid"] == {"string": "GPU-3"}
    assert entry["capacity"]["memory"] == {"value": "19968Mi"}
    assert entry["consumesCounters"] == [
        {
            "counterSet": "nvidia-3-mig",
            "counters": {f"memory-slice-{i}": {"value": "1"} for i in (4, 5, 6, 7)},
        }
    ]
    assert "allowMultipleAllocations" not in entry  # one claim per instance
    whole = migslices.partition_entry(backend(), by_name["nvidia-3-mig-7g-40gb-0"])
    assert len(whole["consumesCounters"][0]["counters"]) == 8  # the whole GPU: every slice


def test_odd_profile_names_still_make_dns_labels() -> None:
    gpu = mig_gpu("H200", ["1g.18gb+me", "1g.18GB-me", "7g." + "x" * 60])
    names = {p.name for p in migslices.gpu_partitions("nvidia", gpu)}
    assert "nvidia-0-mig-1g-18gb-me-0" in names
    assert "nvidia-0-mig-p1-0" in names  # the same label again: by position
    assert "nvidia-0-mig-p2-0" in names  # too long: by position
    assert all(len(n) <= 63 and n.replace("-", "").isalnum() and n.islower() for n in names)


def _check_limits(bodies: list[dict[str, object]]) -> None:
    for body in bodies:
        spec = body["spec"]
        assert isinstance(spec, dict)
        assert ("devices" in spec) != ("sharedCounters" in spec)
        assert len(spec.get("devices", [])) <= 64
        assert len(spec.get("sharedCounters", [])) <= 8
        for counter_set in spec.get("sharedCounters", []):
            assert len(counter_set["counters"]) <= 32


@pytest.mark.parametrize("gpus", [1, 4, 8, 9, 17])
def test_pool_is_cut_within_the_api_limits(gpus: int) -> None:
    devices = [mig_gpu("H200", plain_names("H200"), index=i) for i in range(gpus)]
    bodies = migslices.pool_slices("node-a", backend(), devices, 5)
    _check_limits(bodies)
    names = [b["metadata"]["name"] for b in bodies]
    assert names[0] == "node-a-nvidia-hami-io"  # the one-slice name stays the first
    assert len(set(names)) == len(names)
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in bodies} == {len(bodies)}
    assert {b["spec"]["pool"]["generation"] for b in bodies} == {5}
    devs = [d for b in bodies for d in b["spec"].get("devices", [])]
    sets = {s["name"]: s for b in bodies for s in b["spec"].get("sharedCounters", [])}
    assert len(devs) == 14 * gpus and len(sets) == gpus
    assert len(bodies) == -(-14 * gpus // 64) + -(-gpus // 8)
    for d in devs:  # every consumed counter exists (kube-scheduler refuses the pool otherwise)
        (c,) = d["consumesCounters"]
        assert set(c["counters"]) <= set(sets[c["counterSet"]]["counters"])


def _sick_well_plain(plain_healthy: bool = True) -> list[Device]:
    sick = mig_gpu("A100-SXM4-80GB", ["1g.10gb"], index=0)
    sick = Device(
        sick.uuid,
        0,
        sick.model,
        sick.memory_mib,
        healthy=False,
        unhealthy_reason="xid-79",
        mig=sick.mig,
    )
    well = mig_gpu("A100-SXM4-80GB", ["3g.40gb"], index=1)
    plain = Device("GPU-plain", 2, "NVIDIA-T4", 15360, healthy=plain_healthy)
    return [sick, well, plain]


def test_unhealthy_gpus_leave_the_pool_where_taints_are_not_served() -> None:
    bodies = migslices.pool_slices("n", backend(), _sick_well_plain(), with_taints=False)
    devs = [d["name"] for b in bodies for d in b["spec"].get("devices", [])]
    # Go HAMi's order: a 3g from the highest start first (kube-scheduler takes the first free)
    assert devs == ["nvidia-1-mig-3g-40gb-4", "nvidia-1-mig-3g-40gb-0", "nvidia-2"]
    sets = [s["name"] for b in bodies for s in b["spec"].get("sharedCounters", [])]
    assert sets == ["nvidia-1-mig"]


def test_an_unhealthy_mig_gpu_is_tainted_on_every_partition() -> None:
    bodies = migslices.pool_slices("n", backend(), _sick_well_plain(plain_healthy=False))
    devs = {d["name"]: d for b in bodies for d in b["spec"].get("devices", [])}
    sick = [d for name, d in devs.items() if name.startswith("nvidia-0-mig-")]
    assert len(sick) == 7  # every 1g placement of the sick GPU stays, tainted
    taint = {"key": "hami.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    assert all(d["taints"] == [taint] for d in sick)
    assert all(d["attributes"]["healthy"] == {"bool": False} for d in sick)
    # the healthy GPU's partitions carry none; a plain device is tainted as in one slice
    assert not any("taints" in d for n, d in devs.items() if n.startswith("nvidia-1-"))
    assert devs["nvidia-2"]["taints"] == [{**taint, "value": "unhealthy"}]
    # the sick GPU keeps its counter set: its partitions still consume counters
    sets = [s["name"] for b in bodies for s in b["spec"].get("sharedCounters", [])]
    assert sets == ["nvidia-0-mig", "nvidia-1-mig"]


def test_the_taints_time_is_kept_and_never_reads_as_a_change() -> None:
    b = backend()
    devices = _sick_well_plain()
    first = migslices.plan_pool("n", b, devices, {})
    stamp = "2026-12-03T22:41:07Z"
    stored: dict[str, dict[str, Any] | None] = {}
    for body in first.create:  # as the API server stores it: the taint's time stamped
        copy = {**body, "metadata": {**body["metadata"], "resourceVersion": "7"}}
        for d in copy["spec"].get("devices", []):
            for t in d.get("taints", []):
                t["timeAdded"] = stamp
        stored[body["metadata"]["name"]] = copy
    assert migslices.plan_pool("n", b, devices, stored).empty
    # another change (the plain device fails): the old taints keep their time
    again = migslices.plan_pool("n", b, _sick_well_plain(plain_healthy=False), stored)
    devs = {d["name"]: d for x in again.replace for d in x["spec"].get("devices", [])}
    assert devs["nvidia-0-mig-1g-10gb-6"]["taints"][0]["timeAdded"] == stamp
    assert "timeAdded" not in devs["nvidia-2"]["taints"][0]
    # recovery: no partition is tainted any more
    well = [mig_gpu("A100-SXM4-80GB", ["1g.10gb"], index=0), *_sick_well_plain()[1:]]
    healed = migslices.plan_pool("n", b, well, stored)
    assert not any(d.get("taints") for x in healed.replace for d in x["spec"].get("devices", []))


def test_plan_rewrites_the_whole_pool_only_on_change() -> None:
    b = backend()
    devices = [mig_gpu("H200", plain_names("H200"), index=i) for i in range(9)]
    first = migslices.plan_pool("n", b, devices, {})
    assert len(first.create) == 4 and not first.replace and first.generation == 0
    # as the API server stores them: resourceVersion set, memory canonical (143360Mi = 140Gi)
    stored: dict[str, dict[str, object] | None] = {}
    for i, body in enumerate(first.create):
        copy = {**body, "metadata": {**body["metadata"], "resourceVersion": str(10 + i)}}
        for d in copy["spec"].get("devices", []):
            if d["capacity"]["memory"]["value"] == "143360Mi":
                d["capacity"]["memory"]["value"] = "140Gi"
        stored[body["metadata"]["name"]] = copy
    assert migslices.plan_pool("n", b, devices, stored).empty
    # one GPU fewer: every slice gets generation 1, the now unneeded counter slice goes
    fewer = migslices.plan_pool("n", b, devices[:8], stored)
    assert fewer.generation == 1 and not fewer.create
    assert {x["spec"]["pool"]["generation"] for x in fewer.replace} == {1}
    assert {x["spec"]["pool"]["resourceSliceCount"] for x in fewer.replace} == {3}
    assert fewer.delete == ["n-nvidia-hami-io-counters-2"]
    assert all(x["metadata"].get("resourceVersion") for x in fewer.replace)
    # someone deleted one slice: it is created again, the others rewritten with it
    stored["n-nvidia-hami-io-2"] = None
    repaired = migslices.plan_pool("n", b, devices, stored)
    assert [x["metadata"]["name"] for x in repaired.create] == ["n-nvidia-hami-io-2"]
    assert len(repaired.replace) == 3 and repaired.generation == 1


def test_profile_instance_counts_need_no_counter() -> None:
    """Why the model has no per-profile or compute counter: for the NVML profiles this
    project creates, the instance count is the most disjoint placements (the slice counters
    already allow no more), and the tables' compute slices are never exceeded (checked
    over every layout above)."""
    for table in TABLES:
        for profile in MIG_PROFILES[table]:
            if profile.profile_id not in PLAIN:
                continue
            most = max(
                n
                for n in range(len(profile.placements) + 1)
                for combo in itertools.combinations(profile.placements, n)
                if all(not placements_overlap(a, b) for a, b in itertools.combinations(combo, 2))
            )
            assert profile.instance_count == most, (table, profile.name)
