"""``hami explain`` in DRA mode on a node whose GPU is in MIG mode (hami.dra.migwhynot over
devicepicture's partition reading): the pool as hami.dra.migslices publishes it (partition
devices and the GPU's counter set), claims asking a profile by CEL or a shared GPU, and
the partitions other claims hold. Issue 22 leftover."""

from __future__ import annotations

import copy
from typing import Any

from hami.backends.base import BackendSettings, Device, MigCapability
from hami.backends.fake import FakeBackend
from hami.backends.mig_tables import MIG_PROFILES
from hami.dra import migslices
from hami.dra.explainpod import explain_pod
from hami.protocol.mig import MigProfile
from hami.testkit.dra_pods import claim_spec, dra_pod

NODE = "mig-node"
UUID = "GPU-mig-0"
TABLE = "A100-SXM4-40GB"
ALLOWED = ("1g.5gb", "3g.20gb", "7g.40gb")
DRIVER = "nvidia.hami.io"


def gpu() -> Device:
    profiles = []
    for name in ALLOWED:
        info = next(p for p in MIG_PROFILES[TABLE] if p.name == f"MIG {name}")
        profiles.append(MigProfile(name, info.memory_mb, 0, info.slice_count, info.placements))
    return Device(UUID, 0, TABLE, 40960, mig=MigCapability(tuple(profiles), 7))


def pool() -> list[dict[str, Any]]:
    backend = FakeBackend(BackendSettings(options={"type": "nvidia", "vendor": "NVIDIA"}))
    return migslices.pool_slices(NODE, backend, [gpu()])


def partition(bodies: list[dict[str, Any]], profile: str, start: int) -> str:
    for body in bodies:
        for device in body["spec"].get("devices") or []:
            attrs = device["attributes"]
            if attrs["migProfile"]["string"] == profile and attrs["migStart"]["int"] == start:
                return str(device["name"])
    raise AssertionError(f"no {profile} at {start}")


def profile_spec(profile: str, *, guarded: bool = False) -> dict[str, Any]:
    spec = claim_spec()
    attribute = f'device.attributes["{DRIVER}"].migProfile'
    expression = f'{attribute} == "{profile}"'
    if guarded:  # the form a claim beside shared devices needs (hami demo writes it)
        expression = f"has({attribute}) && {expression}"
    spec["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    return spec


def holder(name: str, device: str) -> dict[str, Any]:
    """Another pod's claim allocated one partition (no consumed capacity, as the allocator
    writes for a device without consumable capacities)."""
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    return {
        "metadata": {"name": name, "namespace": "other"},
        "spec": profile_spec("3g.20gb"),
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def answer(spec: dict[str, Any], bodies: list[Any], others: list[Any]) -> dict[str, Any]:
    pod = dra_pod("p", ["t"])
    pod["metadata"]["namespace"] = "ns"
    pod["status"] = {"resourceClaimStatuses": [{"name": "gpu0", "resourceClaimName": "p-x"}]}
    claim = {"metadata": {"name": "p-x", "namespace": "ns"}, "spec": spec}
    template = {"metadata": {"name": "t", "namespace": "ns"}, "spec": {"spec": spec}}
    got = explain_pod(pod, [claim, *others], {("ns", "t"): template}, bodies, [NODE])
    assert got is not None
    return got


def test_profile_with_a_free_placement_fits() -> None:
    got = answer(profile_spec("3g.20gb"), pool(), [])
    assert got["nodes"] == {NODE: "fits"}
    assert got["object_errors"] == []
    assert not any("migProfile" in n for n in got["notes"])  # the selector is judged


def test_profile_without_room_names_the_gpu_the_slices_and_the_holders() -> None:
    bodies = pool()
    # the 3g placements start at 0 and 4; 7g holds them all, so fill both halves instead
    first, second = partition(bodies, "3g.20gb", 0), partition(bodies, "3g.20gb", 4)
    others = [holder("a", first), holder("b", second)]
    got = answer(profile_spec("3g.20gb"), bodies, others)
    line = got["nodes"][NODE]
    assert line.startswith(f"no 3g.20gb placement free on GPU {UUID}: ")
    assert "slices 0-3 held by claim other/a" in line
    assert "slices 4-7 held by claim other/b" in line
    assert "publishes no" not in line
    assert got["object_errors"] == []  # a partition result needs no consumed capacity


def test_a_held_partition_blocks_only_the_placements_it_overlaps() -> None:
    bodies = pool()
    got = answer(profile_spec("1g.5gb"), bodies, [holder("a", partition(bodies, "3g.20gb", 4))])
    assert got["nodes"] == {NODE: "fits"}
    whole = answer(profile_spec("7g.40gb"), bodies, [holder("a", partition(bodies, "1g.5gb", 6))])
    assert whole["nodes"][NODE] == (
        f"no 7g.40gb placement free on GPU {UUID}: slice 6 held by claim other/a"
    )


def test_a_guarded_profile_selector_is_read_too() -> None:
    bodies = pool()
    others = [holder("a", partition(bodies, "7g.40gb", 0))]
    got = answer(profile_spec("1g.5gb", guarded=True), bodies, others)
    assert got["nodes"][NODE] == (
        f"no 1g.5gb placement free on GPU {UUID}: slices 0-7 held by claim other/a"
    )
    assert got["notes"] == []


def test_profile_the_gpu_does_not_offer() -> None:
    got = answer(profile_spec("2g.10gb"), pool(), [])
    assert got["nodes"][NODE] == (
        f"GPU {UUID} offers no 2g.10gb partition (it offers 1g.5gb, 3g.20gb, 7g.40gb)"
    )


def test_shared_gpu_request_is_told_the_gpu_is_in_mig_mode() -> None:
    spec = claim_spec(mem=1024)
    not_mig = f'!has(device.attributes["{DRIVER}"].migProfile)'
    spec["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": not_mig}}]
    got = answer(spec, pool(), [])
    line = got["nodes"][NODE]
    assert line.startswith(f"GPU {UUID} is in MIG mode: its partitions are not shared devices, ")
    assert line.endswith("asks a shared GPU")
    assert "publishes no" not in line
    assert got["object_errors"] == []


def test_untolerated_taint_of_an_unhealthy_mig_gpu() -> None:
    sick = gpu()
    sick = Device(sick.uuid, 0, TABLE, 40960, healthy=False, mig=sick.mig)
    backend = FakeBackend(BackendSettings(options={"type": "nvidia", "vendor": "NVIDIA"}))
    got = answer(profile_spec("1g.5gb"), migslices.pool_slices(NODE, backend, [sick]), [])
    assert got["nodes"][NODE].startswith(f"GPU {UUID} has the taint hami.io/unhealthy")


def test_malformed_partition_attributes_are_named_and_never_crash() -> None:
    for junk in ({"int": "x"}, {"string": "0"}, None, {"int": -1}, {"int": True}, "3"):
        bodies = copy.deepcopy(pool())
        devices = bodies[0]["spec"]["devices"]
        for device in devices:
            device["attributes"]["migStart"] = junk
        got = answer(profile_spec("1g.5gb"), bodies, [])
        assert any(
            ("MIG" in e and "unreadable" in e) or "not legal" in e for e in got["object_errors"]
        )
        assert got["nodes"][NODE] != "fits"
    bodies = copy.deepcopy(pool())
    bodies[0]["spec"]["devices"][0]["attributes"]["migProfile"] = {"string": 7}
    got = answer(profile_spec("1g.5gb"), bodies, [])
    name = bodies[0]["spec"]["devices"][0]["name"]
    assert any(repr(name) in e and "unreadable" in e for e in got["object_errors"])
