"""Go HAMi's vendor node locks: a Node annotation whose value is only the time it was taken.

Go HAMi 2.10 binds a Cambricon pod under ``cambricon.com/dsmlu.lock`` instead of
``hami.io/mutex.lock``: ``time.Now().Format(time.RFC3339)``, written when absent or older
than two minutes, and removed by Cambricon's dynamic-sMLU device plug-in once it allocated
the pod (a JSON patch ``remove``; it never reads the value). The plug-in finds the pod to
start as the one pending pod of its node that carries the scheduler's decision, so one pod
per node may sit between bind and allocation: the lock is what keeps the second one out.

``VendorLocks.take`` writes such a lock for a bind (a write guarded by the Node's
resourceVersion, so two binds cannot both take it), waiting while a live one is held;
``release`` removes it on undo, only while it still holds the value this bind wrote. The
value names no pod, so a lock is judged by its age alone, with Go's two minutes; a value
that is no RFC 3339 time (Go's ``LockNode`` then fails every bind on the node until
someone removes it) is taken over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from hami import log
from hami.kube.client import Kube
from hami.kube.objects import annotations_of, metadata_of
from hami.kube.raw import Conflict, KubeError
from hami.protocol.nodelock import parse_rfc3339, rfc3339

_log = log.get(__name__)

# Go's Cambricon LockNode takes a lock over once it is this old.
VENDOR_LOCK_TIMEOUT = timedelta(minutes=2)
# How long a bind waits between two reads of a held lock's Node.
POLL_SECONDS = 1.0


class VendorLockError(Exception):
    """The lock was not taken; the message says why and what releases it."""


def lock_value(now: datetime) -> str:
    """The value Go writes: second-precision RFC 3339 (UTC here)."""
    return rfc3339(now)


def free_reason(value: str | None, now: datetime) -> str | None:
    """Why the lock may be taken ("" when there is none), or None while it is held."""
    if value is None:
        return ""
    taken = parse_rfc3339(value)
    if taken is None:
        return f"its value {value!r} is no RFC 3339 time"
    if now - taken > VENDOR_LOCK_TIMEOUT:
        return f"it is older than {VENDOR_LOCK_TIMEOUT.total_seconds():g}s (taken {value})"
    if taken - now > VENDOR_LOCK_TIMEOUT:
        return f"its time {value} is far in the future"
    return None


class VendorLocks:
    """Takes and releases vendor locks for the bind path (``hami.scheduler.bind``)."""

    def __init__(
        self,
        kube: Callable[[], Kube],
        now: Callable[[], datetime],
        monotonic: Callable[[], float],
        sleep: Callable[[float], Awaitable[Any]],
    ) -> None:
        self._kube = kube
        self._now = now
        self._monotonic = monotonic
        self._sleep = sleep

    async def take(self, node: str, key: str, deadline: float, fence: Callable[[], None]) -> str:
        """Write ``key`` on ``node`` and return the value written; ``fence`` runs before
        each write (it raises to stop the bind)."""
        while True:
            current = await self._read(node)
            value = annotations_of(current).get(key)
            reason = free_reason(value, self._now())
            if reason is None:
                remaining = deadline - self._monotonic()
                if remaining <= 0:
                    raise VendorLockError(
                        f"node {node} is locked by {key} (taken {value}) and it was not "
                        "released in time; the vendor's device plug-in removes it after the "
                        f"previous pod's allocation, or it expires after "
                        f"{VENDOR_LOCK_TIMEOUT.total_seconds():g}s"
                    )
                await self._sleep(min(remaining, POLL_SECONDS))
                continue
            if reason:
                _log.info("vendor node lock taken over", node=node, lock=key, reason=reason)
            fence()
            mine = lock_value(self._now())
            version = str(metadata_of(current).get("resourceVersion") or "") or None
            try:
                await self._kube().patch_node_annotations(node, {key: mine}, version)
            except Conflict:
                continue  # the Node changed since the read: judge it again
            except KubeError as exc:
                raise VendorLockError(f"locking node {node} with {key} failed: {exc}") from exc
            return mine

    async def release(self, node: str, key: str, mine: str) -> None:
        """Remove ``key`` if it still holds ``mine`` (best effort: undo must not fail)."""
        for _ in range(3):
            try:
                current = await self._kube().get_node(node)
                if annotations_of(current).get(key) != mine:
                    return  # released by the plug-in, or taken over since
                version = str(metadata_of(current).get("resourceVersion") or "") or None
                await self._kube().patch_node_annotations(node, {key: None}, version)
                return
            except Conflict:
                continue
            except KubeError as exc:
                _log.info("vendor node lock not released", node=node, lock=key, error=str(exc))
                return

    async def _read(self, node: str) -> Any:
        try:
            return await self._kube().get_node(node)
        except KubeError as exc:
            raise VendorLockError(f"reading node {node} failed: {exc}") from exc
