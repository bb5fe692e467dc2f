"""Leader election decisions over a ``coordination.k8s.io/v1`` Lease: pure parts.

``decide`` says what a replica does next from what it last read; ``lease_body`` is the
object it writes. Expiry is judged on this replica's own monotonic clock, from the moment
it first saw the current record (holder and renewTime), never from the timestamps in the
Lease, so clock skew between replicas cannot hand the lease over early.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class Step(enum.Enum):
    CREATE = "create"  # no Lease yet: create it, holding it
    RENEW = "renew"  # ours: write a fresh renewTime
    TAKE = "take"  # expired or released: take it over
    WAIT = "wait"  # held by another live replica
    RELEASE = "release"  # ours, but this replica must not lead: hand it back


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    duration: float  # leaseDurationSeconds
    acquire_time: str
    renew_time: str
    transitions: int
    resource_version: str

    @property
    def seen_key(self) -> tuple[str, str, str]:
        """Changes whenever the holder renews or the lease changes hands."""
        return (self.holder, self.renew_time, self.resource_version)


class Sighting:
    """When this replica first saw the Lease as it is now (holder, renewTime, version), on
    its own monotonic clock: a standby's expiry runs from there."""

    def __init__(self) -> None:
        self.key: tuple[str, str, str] | None = None
        self.since = 0.0

    def see(self, record: LeaseRecord | None, now: float) -> float:
        """Note the record read at ``now``; the seconds it has looked unchanged."""
        key = record.seen_key if record is not None else None
        if key != self.key:
            self.key, self.since = key, now
        return now - self.since


def takeover_bound(lease_duration: float, retry_period: float) -> float:
    """The latest a standby that reads every ``retry_period`` takes the Lease after the
    leader's last renewal: it sees that renewal up to one period later, then waits
    ``lease_duration`` rounded up to whole periods (so ``lease_duration + retry_period``
    when the one divides the other). API latency comes on top."""
    return retry_period + math.ceil(lease_duration / retry_period - 1e-9) * retry_period


# client-go (kube-scheduler) waits retryPeriod * (1 + up to 1.2) between a standby's tries
CLIENT_GO_JITTER = 1.2


def client_go_takeover_bound(lease_duration: float, retry_period: float) -> float:
    """The same for kube-scheduler's Lease: its standby sees the last renewal up to one
    jittered period later and takes over up to one jittered period after it expired."""
    return lease_duration + 2 * (1 + CLIENT_GO_JITTER) * retry_period


def parse_lease(obj: Mapping[str, Any]) -> LeaseRecord:
    """A Lease object -> LeaseRecord; fields of the wrong type read as absent."""
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}

    def text(value: Any) -> str:
        return value if isinstance(value, str) else ""

    def number(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return LeaseRecord(
        holder=text(spec.get("holderIdentity")),
        duration=float(number(spec.get("leaseDurationSeconds"))),
        acquire_time=text(spec.get("acquireTime")),
        renew_time=text(spec.get("renewTime")),
        transitions=number(spec.get("leaseTransitions")),
        resource_version=text(meta.get("resourceVersion")),
    )


def decide(
    record: LeaseRecord | None,
    me: str,
    seen_for: float,
    default_duration: float,
    *,
    eligible: bool = True,
) -> Step:
    """The next step. ``seen_for``: seconds since this replica first saw ``record`` as it
    is now; ``eligible``: whether this replica may lead at all now."""
    if record is None:
        return Step.CREATE if eligible else Step.WAIT
    if record.holder == me:
        return Step.RENEW if eligible else Step.RELEASE
    if not eligible:
        return Step.WAIT
    duration = record.duration if record.duration > 0 else default_duration
    if not record.holder or seen_for >= duration:
        return Step.TAKE
    return Step.WAIT


def micro_time(now: dt.datetime) -> str:
    """A Kubernetes MicroTime."""
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(
    name: str,
    namespace: str,
    me: str,
    step: Step,
    now: dt.datetime,
    duration: float,
    current: LeaseRecord | None,
) -> dict[str, Any]:
    """The Lease to write for ``step`` (CREATE, RENEW, TAKE or RELEASE); guarded by the
    current resourceVersion, so a concurrent writer makes it fail with 409."""
    stamp = micro_time(now)
    transitions = current.transitions if current is not None else 0
    spec: dict[str, Any] = {
        "holderIdentity": me,
        "leaseDurationSeconds": max(1, round(duration)),
        "renewTime": stamp,
        "leaseTransitions": transitions,
    }
    if step is Step.RENEW and current is not None and current.acquire_time:
        spec["acquireTime"] = current.acquire_time
    else:
        spec["acquireTime"] = stamp
    if step is Step.TAKE:
        spec["leaseTransitions"] = transitions + 1
    if step is Step.RELEASE:
        # an empty holder: a standby takes it on its next try instead of waiting it out
        spec["holderIdentity"] = ""
        spec["leaseDurationSeconds"] = 1
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if current is not None and step is not Step.CREATE:
        meta["resourceVersion"] = current.resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": spec,
    }


def follows(holder: str, me: str) -> bool:
    """Whether kube-scheduler's Lease holder is the kube-scheduler of this replica's pod:
    kube-scheduler writes ``<host name>_<uuid>``, and a pod's host name is its name."""
    return bool(me) and holder.startswith(me + "_")
