"""The node lock's one staleness rule, used by the scheduler (bind, filter, the lock sweep)
and the node agent (Allocate) alike (protocol.md section 5).

Pure decisions over the lock value, the lock's pod (plain JSON, or None when it does not
exist) and the time the caller passes in; reading and patching stay with the callers.

A lock is *stale* (anyone may take it over) when

- its value is malformed, or its time is absurd (year 9999, far in the future);
- it is older than the lock timeout (the legacy owner-less form is judged by this alone);
- its pod no longer exists, is being deleted, or finished;
- its pod's allocation ended (``bind-phase`` success or failed), or the pod went elsewhere;
- its pod is still unbound past the bind window (``bind_window``, the scheduler's
  ``bind_lock_wait`` plus slack): the bind that took it sends no Binding after its window,
  so its scheduler died or gave up between the lock and the Binding;
- its pod made no allocation progress for the allocation timeout: a bind and kubelet's
  ``Allocate`` take seconds, so a pod still allocating that long after the lock (or its
  ``bind-time``, whichever is later) lost its ``Allocate`` and would hold the node until
  the lock timeout. Such a pod is failed (``fail_holder``) so that nothing allocates for it
  later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hami.kube.objects import annotations_of, metadata_of
from hami.protocol import keys
from hami.protocol.nodelock import (
    DEFAULT_LOCK_TIMEOUT,
    NodeLock,
    is_sane,
    older_than,
    parse_lock,
    parse_unix_time,
    rfc3339,
)

DEFAULT_ALLOCATION_TIMEOUT = timedelta(seconds=60)
# Pod phases after which a pod holds nothing (the same as hami.core.cluster's).
_FINISHED = ("Succeeded", "Failed")
_ENDED = (keys.BindPhase.SUCCESS.value, keys.BindPhase.FAILED.value)
OWN_LOCK = "the lock is this pod's own"


@dataclass(frozen=True, slots=True)
class LockRules:
    timeout: timedelta = DEFAULT_LOCK_TIMEOUT  # scheduler.node_lock_timeout
    allocation_timeout: timedelta = DEFAULT_ALLOCATION_TIMEOUT  # scheduler.allocation_timeout
    # the longest a bind may take from its lock to its Binding (None: not known, as on the
    # node agent, which only ever judges locks of bound pods)
    bind_window: timedelta | None = None


@dataclass(frozen=True, slots=True)
class LockView:
    """The lock judged from its value alone."""

    lock: NodeLock | None  # None: free or malformed
    free: bool  # no lock, or one anyone may take over without reading its pod
    reason: str  # why it is free ("" when there is no lock, or when it is held)

    @property
    def needs_pod(self) -> bool:
        """Held by a named pod whose state decides whether the lock is stale."""
        return not self.free and self.lock is not None and self.lock.owner is not None


@dataclass(frozen=True, slots=True)
class HolderVerdict:
    """The lock judged with its pod's state."""

    stale: bool
    reason: str  # why it is stale, "" when held
    fail_holder: bool = False  # the pod lost its Allocate: mark it bind-phase failed
    # stale because the pod's allocation ended: its node agent releases the lock next
    ended: bool = False


def judge_value(
    value: str | None, now: datetime, rules: LockRules, me: str | None = None
) -> LockView:
    """The lock from its value: free, stale (malformed, absurd, expired, ours) or held.

    ``me`` is the ``namespace/name`` of the pod asking: its own lock never blocks it."""
    if not value:
        return LockView(None, True, "")
    lock = parse_lock(value)
    if lock is None:
        return LockView(None, True, "the lock value is malformed")
    return judge_lock(lock, now, rules, me)


def judge_lock(lock: NodeLock, now: datetime, rules: LockRules, me: str | None = None) -> LockView:
    """``judge_value`` for a lock already parsed."""
    if not is_sane(lock.time, now, rules.timeout):
        return LockView(lock, True, f"the lock time {rfc3339_total(lock)} is absurd")
    if lock.is_expired(now, rules.timeout):
        return LockView(lock, True, f"the lock is older than {rules.timeout.total_seconds():g}s")
    if me is not None and lock.owner == me:
        return LockView(lock, True, OWN_LOCK)
    return LockView(lock, False, "")


def held_longer_than(
    lock: NodeLock | None, now: datetime, rules: LockRules, after: timedelta, me: str
) -> bool:
    """Another pod holds a live lock taken more than ``after`` ago (filter tries such a node
    last: a bind there waits for the lock, and a healthy holder keeps it for seconds)."""
    if lock is None or judge_lock(lock, now, rules, me).free:
        return False
    return older_than(lock.time, now, after)


def judge_holder(
    lock: NodeLock,
    pod: Mapping[str, Any] | None,
    node: str,
    now: datetime,
    rules: LockRules,
) -> HolderVerdict:
    """Whether a held lock (``judge_value`` said held) is stale given its pod (None: gone)."""
    if pod is None:
        return HolderVerdict(True, "its pod no longer exists")
    if metadata_of(pod).get("deletionTimestamp"):
        return HolderVerdict(True, "its pod is being deleted")
    phase = (pod.get("status") or {}).get("phase")
    if phase in _FINISHED:
        return HolderVerdict(True, f"its pod finished ({phase})")
    moved = _moved_on(pod, node)
    if moved:
        ended = annotations_of(pod).get(keys.BIND_PHASE) in _ENDED
        return HolderVerdict(True, moved, ended=ended)
    bound = (pod.get("spec") or {}).get("nodeName") == node
    if (
        not bound
        and rules.bind_window is not None
        and older_than(lock.time, now, rules.bind_window)
    ):
        return HolderVerdict(
            True,
            f"its pod is still unbound {rules.bind_window.total_seconds():g}s after the lock "
            "(its bind is no longer in flight)",
        )
    since = progress_since(lock, pod, now, rules)
    if older_than(since, now, rules.allocation_timeout):
        return HolderVerdict(
            True,
            f"its pod made no allocation progress since {rfc3339(since)} "
            f"(allocation timeout {rules.allocation_timeout.total_seconds():g}s)",
            fail_holder=bound
            and annotations_of(pod).get(keys.BIND_PHASE) == keys.BindPhase.ALLOCATING,
        )
    return HolderVerdict(False, "")


def progress_since(
    lock: NodeLock, pod: Mapping[str, Any], now: datetime, rules: LockRules
) -> datetime:
    """The last sign of progress: the lock time, or the pod's later sane ``bind-time``."""
    bound_at = parse_unix_time(annotations_of(pod).get(keys.BIND_TIME))
    if bound_at is not None and bound_at > lock.time and is_sane(bound_at, now, rules.timeout):
        return bound_at
    return lock.time


def rfc3339_total(lock: NodeLock) -> str:
    try:
        return rfc3339(lock.time)
    except (ValueError, OverflowError):
        return repr(lock.time)


def _moved_on(pod: Mapping[str, Any], node: str) -> str:
    """Why a live lock holder no longer needs this node's lock, or "" if it does."""
    annotations = annotations_of(pod)
    phase = annotations.get(keys.BIND_PHASE)
    if phase in _ENDED:
        return f"its pod's allocation already ended ({phase})"
    bound_to = (pod.get("spec") or {}).get("nodeName")
    chosen = annotations.get(keys.VGPU_NODE)
    if bound_to and bound_to != node:
        return f"its pod is bound to node {bound_to}"
    if not bound_to and chosen and chosen != node:
        return f"its pod was since placed on node {chosen}"
    return ""
