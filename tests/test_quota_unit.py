"""Namespace device quotas (hami.core.quota): limits read from ResourceQuota objects,
holds charged per resource, the quick check. Pure."""

from __future__ import annotations

from typing import Any

from _core_helpers import MLU, NVIDIA, gpu, pod

from hami.core.quota import QUOTA_EXCEEDED, Quotas
from hami.core.requests import parse_pod
from hami.core.usage import Use

MEM, CORES = "nvidia.com/gpumem", "nvidia.com/gpucores"


def quota(namespace: str, name: str, hard: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {"hard": hard}}


# ---------------------------------------------------------------- reading limits


def test_only_limits_keys_of_managed_resources_are_read() -> None:
    q = Quotas([NVIDIA])
    errors = q.upsert(
        quota(
            "team",
            "gpu",
            {
                f"limits.{MEM}": "10k",  # the API server's canonical form of 10000
                f"limits.{CORES}": "150",
                f"requests.{MEM}": "1",  # the API server's own business
                "limits.nvidia.com/gpu": "1",  # not a quota HAMi reads
                "pods": "3",
            },
        )
    )
    assert errors == []
    assert [(r.resource.name, r.limit, r.quota) for r in q.status("team")] == [
        (CORES, 150, "gpu"),
        (MEM, 10000, "gpu"),
    ]


def test_an_unreadable_value_limits_nothing_and_is_reported_once() -> None:
    q = Quotas([NVIDIA])
    bad = quota("team", "gpu", {f"limits.{MEM}": "1.5", f"limits.{CORES}": "50"})
    (error,) = q.upsert(bad)
    assert "ResourceQuota team/gpu" in error and f"limits.{MEM}" in error and "'1.5'" in error
    assert q.upsert(bad) == []  # the quota controller rewrites status often: once is enough
    assert [r.resource.name for r in q.status("team")] == [CORES]
    assert q.exceeded("team", {MEM: 10**9}) is None
    for junk in ({f"limits.{MEM}": ["x"]}, {f"limits.{MEM}": "-1"}, {f"limits.{MEM}": "9" * 99}):
        assert q.upsert(quota("team", "junk", junk))
    assert q.upsert({"metadata": {"namespace": "team", "name": "odd"}, "spec": "nonsense"}) == []


def test_several_quotas_in_a_namespace_all_apply() -> None:
    q = Quotas([NVIDIA])
    q.upsert(quota("team", "big", {f"limits.{MEM}": "20000"}))
    q.upsert(quota("team", "small", {f"limits.{MEM}": "5000"}))
    assert "ResourceQuota small allows 5000MiB" in (q.exceeded("team", {MEM: 6000}) or "")
    q.delete("team", "small")
    assert q.exceeded("team", {MEM: 6000}) is None
    q.upsert(quota("team", "big", {"pods": "1"}))  # edited: no device key left
    assert q.status("team") == []


def test_memory_limits_are_scaled_to_mib_like_hami_memory_factor() -> None:
    q = Quotas([MLU])  # Cambricon counts memory in 256 MiB units
    q.upsert(quota("team", "mlu", {"limits.cambricon.com/mlu.smlu.vmemory": "40"}))
    (row,) = q.status("team")
    assert (row.limit, row.limit_scaled, row.resource.unit) == (40, 10240, "MiB")
    assert q.exceeded("team", {"cambricon.com/mlu.smlu.vmemory": 10240}) is None
    assert q.exceeded("team", {"cambricon.com/mlu.smlu.vmemory": 10241}) is not None


def test_charge_ignores_uuids_of_no_known_type_with_several_backends() -> None:
    q = Quotas([NVIDIA, MLU])
    usage = {"GPU-x": Use(1, 1000, 10), "MLU-x": Use(1, 512, 100)}
    assert q.charge(usage, {"GPU-x": "nvidia"}) == {MEM: 1000, CORES: 10}
    assert Quotas([NVIDIA]).charge(usage, {}) == {MEM: 1512, CORES: 110}


def test_the_quick_check_counts_the_least_a_pod_can_hold() -> None:
    q = Quotas([NVIDIA])
    q.upsert(quota("team", "gpu", {f"limits.{MEM}": "5000", f"limits.{CORES}": "100"}))

    def check(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> str | None:
        parsed = parse_pod(pod(*containers, init=init, namespace="team"), [NVIDIA])
        assert parsed is not None
        return q.precheck("team", parsed)

    assert (check(gpu(count=2, mem=3000)) or "").startswith(QUOTA_EXCEEDED)  # 2 x 3000
    assert check(gpu(count=2, mem=2500)) is None
    assert check(gpu(count=2, pct=90)) is None  # its MiB depend on the device: per node
    assert (check(gpu(mem=1000, cores=60), gpu(mem=1000, cores=60)) or "").startswith(
        QUOTA_EXCEEDED
    )  # app containers add up: 120 % of 100
    # init containers run one at a time: the largest counts, not their sum
    assert check(gpu(mem=1000), init=(gpu(mem=4000), gpu(mem=4000))) is None
    assert (check(gpu(mem=1000), init=(gpu(mem=6000),)) or "").startswith(QUOTA_EXCEEDED)
    big = parse_pod(pod(gpu(mem=10**6)), [NVIDIA])
    assert big is not None and q.precheck("elsewhere", big) is None  # no quota there
