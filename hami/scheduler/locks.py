"""Node locks as this replica sees them, and the judgement of a lock's holder with the
API reads it needs.

The rules themselves are pure (``hami.kube.nodelock``); this module keeps the parsed lock
of every node from the Node watch, remembers this replica's lock writes that the watch has
not shown yet, and does the reads and the one write (failing a holder that lost its
Allocate) that judging a holder takes. The bind path (``hami.scheduler.bind``) and the lock
sweep (``hami.scheduler.handshake``) both use it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

from hami import log
from hami.kube.client import Kube
from hami.kube.nodelock import (
    OWN_LOCK,
    LockRules,
    held_longer_than,
    judge_holder,
    judge_value,
)
from hami.kube.objects import annotations_of, metadata_of
from hami.kube.raw import KubeError, NotFound
from hami.protocol import NodeLock, keys, parse_lock
from hami.scheduler.clock import Clock

_log = log.get(__name__)

Json = dict[str, Any]
# Lock holders remembered per node between two checks of this replica there; past this the
# node's binds are mostly another scheduler's, and the next check lists the node's pods.
MAX_HOLDERS = 64
# (namespace, name, uid, reason, message, type): queue an Event about a pod
EventRef = Callable[[str, str, str | None, str, str, str], None]


class NodeLocks:
    def __init__(
        self,
        kube: Callable[[], Kube],
        rules: LockRules,
        clock: Clock,
        event_ref: EventRef,
        *,
        busy_after: timedelta,
    ) -> None:
        self._kube = kube
        self.rules = rules
        self.clock = clock
        self._event_ref = event_ref
        self.busy_after = busy_after  # a lock held this long is suspect (filter tries it last)
        self.parsed: dict[str, NodeLock] = {}  # node -> its hami.io/mutex.lock, as watched
        # node -> (resourceVersion, lock value) of our latest lock write not yet seen by the
        # Node watch: until it is, the watch's copy of the node is older than that write
        self.writes: dict[str, tuple[str, str]] = {}
        # node -> (lock value, monotonic time) first judged stale only because its pod's
        # allocation ended: its node agent's release is on its way
        self._ended: dict[str, tuple[str, float]] = {}
        # node -> the pods (namespace/name) whose locks the Node watch showed since this
        # replica's last bind check there, in order; absent where that is not known (no
        # check yet, a relist since, a lock naming no pod). A bind whose Binding carries its
        # decision skips its list of the node's pods when each of these is in its picture.
        self.holders: dict[str, list[str]] = {}

    # ------------------------------------------------------------------ the watch's view

    def node_seen(self, name: str, version: str, old: str | None, new: str | None) -> bool:
        """The Node watch showed ``name`` at ``version`` with lock ``new`` (was ``old``);
        True when the lock changed."""
        written = self.writes.get(name)
        if written is not None and (version == written[0] or new == written[1]):
            del self.writes[name]  # the watch caught up with our lock write
        if new == old:
            return False
        self._ended.pop(name, None)
        lock = parse_lock(new)
        if lock is None:
            self.parsed.pop(name, None)
            if new is not None:
                self.holders.pop(name, None)  # unreadable: who holds it is not known
        else:
            self.parsed[name] = lock
            history = self.holders.get(name)
            if lock.owner is None:
                self.holders.pop(name, None)
            elif history is not None:
                if len(history) >= MAX_HOLDERS:
                    del self.holders[name]  # mostly others' binds: the list read is cheaper
                else:
                    history.append(lock.owner)
        return True

    def lost_track(self) -> None:
        """The Node watch listed again: lock values between its last event and the list
        were never shown, so no node's holders are known."""
        self.holders.clear()

    def checked(self, node: str, pod: str) -> None:
        """A bind of ``pod`` checked its fit on ``node`` with every earlier holder counted,
        under its own lock: later checks need only the holders since (and this pod)."""
        self.holders[node] = [pod]

    def forget(self, name: str) -> None:
        self.parsed.pop(name, None)
        self.writes.pop(name, None)
        self._ended.pop(name, None)
        self.holders.pop(name, None)

    def wrote(self, node: str, version: str, value: str, seen: tuple[str, str | None]) -> None:
        """Our lock write left the Node at ``version``; ``seen`` is the watch's (version,
        lock) of the node now."""
        if seen[0] != version and seen[1] != value:
            self.writes[node] = (version, value)  # the watch has not shown it yet

    def busy(self, names: Collection[str], me: str) -> set[str]:
        """Of ``names``, the nodes whose lock another pod has held longer than a healthy
        allocation takes (only the nodes with a lock are looked at: few)."""
        now = self.clock.now()
        busy = {
            name
            for name, lock in self.parsed.items()
            if held_longer_than(lock, now, self.rules, self.busy_after, me)
        }
        if busy:
            busy.intersection_update(names)
        return busy

    def suspect(self) -> list[str]:
        """Nodes whose lock is held longer than a healthy allocation takes (the sweep)."""
        now = self.clock.now()
        return [
            node
            for node, lock in list(self.parsed.items())
            if held_longer_than(lock, now, self.rules, self.busy_after, "")
        ]

    # ------------------------------------------------------------------ holders

    async def live_holder(
        self,
        value: str | None,
        node: str,
        namespace: str,
        name: str,
        *,
        release_grace: float = 0.0,
    ) -> NodeLock | None:
        """The lock's holder if it blocks ``namespace/name``; None when free, ours or stale
        (one rule: ``hami.kube.nodelock``). A holder that lost its Allocate is failed
        first. A holder whose allocation just ended still blocks for ``release_grace``
        seconds: its node agent writes the pod and then releases the lock (or both at
        once), and a lock written over it before the release lands only meets a 409
        Conflict and a read of the Node."""
        now = self.clock.now()
        view = judge_value(value, now, self.rules, me=f"{namespace}/{name}")
        if view.free:
            if view.reason and view.reason != OWN_LOCK:
                _log.info("taking over a node lock", node=node, lock=value, reason=view.reason)
            return None
        lock = view.lock
        assert lock is not None
        if not view.needs_pod:
            return lock  # the legacy owner-less form: held until the lock timeout
        try:
            holder: Json | None = await self._kube().get_pod(lock.namespace, lock.pod)
        except NotFound:
            holder = None
        except KubeError:
            return lock  # cannot tell: treat as held
        verdict = judge_holder(lock, holder, node, now, self.rules)
        if not verdict.stale:
            return lock
        if verdict.ended and release_grace > 0:
            value_seen, since = self._ended.setdefault(node, (value or "", self.clock.monotonic()))
            if value_seen == value and self.clock.monotonic() - since < release_grace:
                return lock  # the release is on its way: wait for the watch to show it
        failed = holder is not None and verdict.fail_holder
        if failed and not await self.fail_stalled_holder(holder or {}, node, verdict.reason):
            return lock  # it changed meanwhile (or the write failed): judge again
        # A scheduler that died between locking and binding, or a pod whose Allocate was
        # lost, leaves such a lock; waiting the full lock timeout would stall the node.
        _log.info("taking over a node lock", node=node, lock=value, reason=verdict.reason)
        return None

    async def fail_stalled_holder(self, holder: Json, node: str, reason: str) -> bool:
        """Mark a lock holder that lost its Allocate ``bind-phase: failed`` (guarded by its
        resourceVersion: a pod that progressed meanwhile is left alone); True when done."""
        meta = metadata_of(holder)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        try:
            await self._kube().patch_pod_annotations(
                namespace,
                name,
                {keys.BIND_PHASE: str(keys.BindPhase.FAILED)},
                resource_version=str(meta.get("resourceVersion") or "") or None,
            )
        except KubeError as exc:
            _log.info("stalled lock holder not failed", pod=f"{namespace}/{name}", error=str(exc))
            return False
        message = (
            f"pod {namespace}/{name} was bound to node {node} but {reason}; marked "
            f"{keys.BIND_PHASE}=failed and its node lock taken over so the node can take other "
            "pods (kubelet never called Allocate for it). Delete and recreate the pod"
        )
        _log.warning("lock holder failed", pod=f"{namespace}/{name}", node=node, reason=reason)
        uid = str(meta.get("uid") or "") or None
        self._event_ref(namespace, name, uid, "AllocationTimedOut", message, "Warning")
        return True

    async def release_if_stale(self, node: str) -> None:
        """Remove ``node``'s lock when the rules say nobody holds it any more (read fresh)."""
        kube = self._kube()
        try:
            current = await kube.get_node(node)
        except KubeError:
            return
        value = annotations_of(current).get(keys.NODE_LOCK)
        now = self.clock.now()
        view = judge_value(value, now, self.rules)
        if not view.needs_pod or view.lock is None:
            return  # free, or stale by its value alone: the next bind takes it over
        lock = view.lock
        try:
            holder: Json | None = await kube.get_pod(lock.namespace, lock.pod)
        except NotFound:
            holder = None
        except KubeError:
            return
        verdict = judge_holder(lock, holder, node, now, self.rules)
        if not verdict.stale:
            return
        if verdict.fail_holder and not await self.fail_stalled_holder(
            holder or {}, node, verdict.reason
        ):
            return
        version = str(metadata_of(current).get("resourceVersion") or "") or None
        try:
            await kube.patch_node_annotations(
                node, {keys.NODE_LOCK: None}, resource_version=version
            )
        except KubeError:
            return  # changed meanwhile (a bind took it): judged again next pass
        _log.info("stale node lock released", node=node, lock=value, reason=verdict.reason)


def holder_words(lock: NodeLock) -> str:
    if lock.owner is None:
        return "an older HAMi scheduler (a lock naming no pod)"
    return f"pod {lock.owner}"
