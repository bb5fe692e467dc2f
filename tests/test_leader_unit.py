"""Leader election decisions (hami.scheduler.lease): pure, no API server."""

from __future__ import annotations

import datetime as dt
import socket
from pathlib import Path

import pytest

from hami.config import LeaderElectionConfig
from hami.scheduler import podinfo
from hami.scheduler.leader import FOLLOW_POLL
from hami.scheduler.lease import (
    LeaseRecord,
    Sighting,
    Step,
    client_go_takeover_bound,
    decide,
    follows,
    lease_body,
    micro_time,
    parse_lease,
    takeover_bound,
)

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


def record(holder: str, duration: float = 15, rv: str = "7", transitions: int = 2) -> LeaseRecord:
    return LeaseRecord(holder, duration, "t0", "t1", transitions, rv)


def test_decide() -> None:
    assert decide(None, "a", 0, 15) is Step.CREATE
    assert decide(record("a"), "a", 100, 15) is Step.RENEW  # ours, however old it looks
    assert decide(record("b"), "a", 14.9, 15) is Step.WAIT
    assert decide(record("b"), "a", 15, 15) is Step.TAKE  # unchanged for a whole duration
    assert decide(record("b", duration=30), "a", 20, 15) is Step.WAIT  # the lease's own duration
    assert decide(record("b", duration=0), "a", 15, 15) is Step.TAKE  # none written: ours
    assert decide(record(""), "a", 0, 15) is Step.TAKE  # released
    # not eligible (its kube-scheduler does not lead): never take, hand back what it holds
    assert decide(None, "a", 0, 15, eligible=False) is Step.WAIT
    assert decide(record(""), "a", 0, 15, eligible=False) is Step.WAIT
    assert decide(record("a"), "a", 0, 15, eligible=False) is Step.RELEASE


def test_lease_bodies_are_guarded_by_the_resource_version() -> None:
    created = lease_body("l", "ns", "a", Step.CREATE, NOW, 15, None)
    assert created["metadata"] == {"name": "l", "namespace": "ns"}
    assert created["spec"] == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T12:00:00.123456Z",
        "renewTime": "2026-01-01T12:00:00.123456Z",
        "leaseTransitions": 0,
    }
    renewed = lease_body("l", "ns", "a", Step.RENEW, NOW, 15, record("a"))
    assert renewed["metadata"]["resourceVersion"] == "7"
    assert renewed["spec"]["acquireTime"] == "t0"  # kept while the same holder renews
    assert renewed["spec"]["leaseTransitions"] == 2
    taken = lease_body("l", "ns", "a", Step.TAKE, NOW, 15, record("b"))
    assert taken["spec"]["leaseTransitions"] == 3
    assert taken["spec"]["acquireTime"] == micro_time(NOW)
    released = lease_body("l", "ns", "a", Step.RELEASE, NOW, 15, record("a"))
    assert released["spec"]["holderIdentity"] == ""
    assert released["spec"]["leaseDurationSeconds"] == 1
    assert released["metadata"]["resourceVersion"] == "7"


def test_parse_lease_reads_junk_as_absent() -> None:
    lease = {
        "metadata": {"resourceVersion": "9"},
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "renewTime": "r",
            "leaseTransitions": 4,
        },
    }
    assert parse_lease(lease) == LeaseRecord("a", 15.0, "", "r", 4, "9")
    junk = {"metadata": "x", "spec": {"holderIdentity": 5, "leaseDurationSeconds": True}}
    assert parse_lease(junk) == LeaseRecord("", 0.0, "", "", 0, "")


def test_follows_matches_kube_schedulers_holder_form() -> None:
    assert follows("hami-scheduler-7d9f-abcde_0f3c2a", "hami-scheduler-7d9f-abcde")
    assert not follows("hami-scheduler-7d9f-abcdef_0f3c2a", "hami-scheduler-7d9f-abcde")
    assert not follows("", "pod")
    assert not follows("_x", "")


def test_namespace_and_identity_come_from_config_then_the_pod(tmp_path: Path) -> None:
    account = tmp_path / "namespace"
    key = "scheduler.leader_election.namespace"
    assert podinfo.namespace("cfg", key, {"POD_NAMESPACE": "env"}, account) == "cfg"
    assert podinfo.namespace("", key, {"POD_NAMESPACE": "env"}, account) == "env"
    account.write_text("from-account\n")
    assert podinfo.namespace("", key, {}, account) == "from-account"
    with pytest.raises(podinfo.PodInfoError, match=r"config key scheduler\.leader_election"):
        podinfo.namespace("", key, {}, tmp_path / "absent")
    assert podinfo.identity("me", {"POD_NAME": "pod"}) == "me"
    assert podinfo.identity("", {"POD_NAME": "pod"}) == "pod"
    assert podinfo.identity("", {}) == socket.gethostname()


def _takeover(lease: float, retry: float, standby_phase: float, died: float) -> tuple[float, float]:
    """A fake-clock run of the standby's reads (Sighting and decide, as LeaderElector.step
    uses them): the leader renews every ``retry`` from t=0 and dies ``died`` seconds into
    its life; the standby reads every ``retry`` from ``standby_phase``. Returns the time of
    the leader's last renewal and the time the standby takes the Lease."""
    renewals = [k * retry for k in range(int(died / retry) + 1)]
    seen = Sighting()
    for k in range(1000):
        t = standby_phase + k * retry  # not a running sum: no rounding drift
        done = [r for r in renewals if r <= t]
        current = LeaseRecord("a", lease, "t0", f"r{len(done)}", 0, str(len(done)))
        if decide(current, "b", seen.see(current, t), lease) is Step.TAKE:
            return renewals[-1], t
    raise AssertionError("the standby never took over")


@pytest.mark.parametrize(("lease", "retry"), [(8, 1), (15, 2), (10, 3)])
def test_a_standby_takes_over_no_later_than_the_bound_and_never_early(
    lease: float, retry: float
) -> None:
    worst, earliest = 0.0, float("inf")
    for i in range(32):  # the standby's phase across one period (exact binary fractions)
        for died in (30.0 + retry / 64, 30.0 + retry * 63 / 64):
            last, took = _takeover(lease, retry, i * retry / 32, died)
            worst = max(worst, took - last)
            earliest = min(earliest, took - last)
    print(f"lease {lease}s retry {retry}s: takeover {earliest:.2f}-{worst:.2f}s after the")
    print(f"  last renewal; bound {takeover_bound(lease, retry):.2f}s")
    assert worst <= takeover_bound(lease, retry)
    assert worst > takeover_bound(lease, retry) - retry / 20  # the bound is tight
    assert earliest >= lease  # never while the leader may still act (renew_deadline < lease)
    if lease % retry == 0:
        assert takeover_bound(lease, retry) == lease + retry


def test_the_default_timing_takes_over_within_15_seconds() -> None:
    """Issue 12: a standby pod takes over within 15 s of the leader pod's death. The pod
    leads once both kube-scheduler (client-go, jittered retries) and hami (which then
    notices within FOLLOW_POLL) hold their Leases; the chart gives both the same timing."""
    cfg = LeaderElectionConfig()
    lease, renew, retry = (
        cfg.lease_duration.seconds,
        cfg.renew_deadline.seconds,
        cfg.retry_period.seconds,
    )
    hami = takeover_bound(lease, retry)
    kube_scheduler = client_go_takeover_bound(lease, retry) + FOLLOW_POLL
    print(
        f"worst case after the last renewal: hami {hami:.2f}s, kube-scheduler {kube_scheduler:.2f}s"
    )
    assert max(hami, kube_scheduler) <= 15 - 2  # 2 s for API latency and a loaded machine
    assert lease - renew >= 3  # room for clock drift and a slow write between the two
    assert renew > 1.2 * retry  # client-go's own rule for kube-scheduler's copy
