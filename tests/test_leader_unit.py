"""Leader election decisions (hami.scheduler.lease): pure, no API server."""

from __future__ import annotations

import datetime as dt
import socket
from pathlib import Path

import pytest

from hami.scheduler import podinfo
from hami.scheduler.lease import (
    LeaseRecord,
    Step,
    decide,
    follows,
    lease_body,
    micro_time,
    parse_lease,
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
