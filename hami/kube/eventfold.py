"""Which Event writes to make: folding repeats and a per-object rate limit (pure, no I/O).

kube-scheduler calls the extender's filter again on every retry of a pending pod, so the
same reason and message come back every few seconds. Like client-go's recorder this
folds occurrences with the same involved object, type, reason and message into ONE core/v1
Event whose ``count`` and ``lastTimestamp`` grow, and bounds the writes per object:

- the first occurrence of a key is written at once (a create) if the object's token
  bucket has a token;
- repeats are folded in memory and written (a patch of ``count`` and ``lastTimestamp``) at
  most once per ``update_every`` seconds per key, again only with a token;
- each write takes one token of the involved object's bucket: ``burst`` at first, then one
  more every ``refill`` seconds. A key that finds no token waits (its count keeps
  growing) and is written when one is there; new keys go before count updates.

The sender (``hami.kube.recorder``) feeds ``add``, asks ``due`` what to write and reports
back with ``written``/``failed``. Time is a monotonic float passed in by the caller.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

BURST = 5
REFILL_SECONDS = 60.0
UPDATE_EVERY = 60.0
MAX_KEYS = 4096


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The involved object of an Event (a pod)."""

    namespace: str
    name: str
    uid: str
    kind: str = "Pod"
    resource_version: str = ""

    @property
    def id(self) -> str:
        return self.uid or f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Occurrence:
    ref: ObjectRef
    reason: str
    message: str
    type_: str
    at: datetime  # wall time, for first/lastTimestamp


Key = tuple[str, str, str, str]  # (object id, type, reason, message)


def key_of(occ: Occurrence) -> Key:
    return (occ.ref.id, occ.type_, occ.reason, occ.message)


@dataclass(slots=True)
class Fold:
    """One Event object (written or to be): its occurrences so far and what was sent."""

    key: Key
    first: Occurrence
    last: datetime
    count: int = 1
    written: int = 0  # the count the API server has; 0: no Event object yet
    name: str = ""  # the Event object's name once created
    due_at: float = 0.0  # monotonic time from which it may be written

    @property
    def dirty(self) -> bool:
        return self.count > self.written


@dataclass(frozen=True, slots=True)
class Write:
    """What the sender sends: a create (no Event object yet) or a patch of ``name``."""

    key: Key
    first: Occurrence
    count: int
    last: datetime
    name: str

    @property
    def create(self) -> bool:
        return not self.name


@dataclass(slots=True)
class Bucket:
    """A token bucket: ``burst`` tokens, one more every ``refill`` seconds."""

    tokens: float
    stamp: float

    def _fill(self, now: float, burst: int, refill: float) -> None:
        if now > self.stamp:
            self.tokens = min(float(burst), self.tokens + (now - self.stamp) / refill)
            self.stamp = now

    def take(self, now: float, burst: int, refill: float) -> bool:
        self._fill(now, burst, refill)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def next_token(self, now: float, burst: int, refill: float) -> float:
        """When the next whole token is there (``now`` if one is)."""
        self._fill(now, burst, refill)
        return now if self.tokens >= 1.0 else now + (1.0 - self.tokens) * refill


@dataclass
class Folder:
    burst: int = BURST
    refill: float = REFILL_SECONDS
    update_every: float = UPDATE_EVERY
    max_keys: int = MAX_KEYS
    folded: int = 0  # occurrences that did not need an Event object of their own
    evicted: int = 0  # keys forgotten with occurrences never written (cache full)
    _folds: OrderedDict[Key, Fold] = field(default_factory=OrderedDict)
    _buckets: OrderedDict[str, Bucket] = field(default_factory=OrderedDict)
    _dirty: dict[Key, None] = field(default_factory=dict)  # ordered: oldest first
    # (due_at, sequence, key) of dirty folds; an entry whose fold has another due_at now
    # is stale and skipped when it comes up, so every change is one O(log n) push.
    _timers: list[tuple[float, int, Key]] = field(default_factory=list)
    _sequence: int = 0

    def __post_init__(self) -> None:
        if self.burst < 1 or self.refill <= 0 or self.update_every < 0 or self.max_keys < 1:
            raise ValueError(
                "event folder: burst >= 1, refill > 0, update_every >= 0, max_keys >= 1"
            )

    def __len__(self) -> int:
        return len(self._folds)

    def add(self, occ: Occurrence, now: float) -> bool:
        """Count one occurrence (O(log n)); True when it folded into an existing key."""
        key = key_of(occ)
        fold = self._folds.get(key)
        folded = fold is not None
        if fold is None:
            fold = Fold(key=key, first=occ, last=occ.at, due_at=now)
            self._folds[key] = fold
            if len(self._folds) > self.max_keys:
                self._evict()
        else:
            self._folds.move_to_end(key)
            fold.count += 1
            fold.last = max(fold.last, occ.at)
            self.folded += 1
        if key not in self._dirty:
            self._dirty[key] = None
            self._schedule(fold)
        return folded

    def next_due(self, now: float) -> float | None:
        """Seconds until a write may be due (0: now), or None when nothing waits (or only
        writes on the wire, which report back)."""
        self._drop_stale()
        if not self._timers:
            return None
        return max(0.0, self._timers[0][0] - now)

    def due(self, now: float) -> list[Write]:
        """The writes to make now, each holding a token of its object: new keys first.
        Costs O(log n) per fold that is due, never a scan of every fold."""
        ready: list[tuple[bool, float, int, Fold]] = []
        seen: set[Key] = set()  # a key forgotten and seen again may have two entries
        while self._timers and self._timers[0][0] <= now:
            at, sequence, key = heapq.heappop(self._timers)
            fold = self._folds.get(key)
            if fold is not None and fold.due_at == at and key in self._dirty and key not in seen:
                seen.add(key)
                ready.append((fold.written > 0, at, sequence, fold))
        ready.sort(key=lambda r: r[:3])
        writes: list[Write] = []
        for *_, fold in ready:
            bucket = self._bucket(fold.key[0], now)
            if bucket.take(now, self.burst, self.refill):
                writes.append(self._write(fold))
                # Not due again before the sender reports back (written/failed).
                fold.due_at = float("inf")
            else:
                fold.due_at = bucket.next_token(now, self.burst, self.refill)
                self._schedule(fold)
        return writes

    def drain(self) -> list[Write]:
        """Every dirty fold, ignoring the limits (a last flush at shutdown)."""
        writes = [self._write(self._folds[k]) for k in self._dirty]
        for write in writes:
            self._folds[write.key].due_at = float("inf")
        self._timers.clear()
        return writes

    def written(self, write: Write, name: str, now: float) -> None:
        """The API server has ``write.count`` occurrences in Event ``name``."""
        fold = self._folds.get(write.key)
        if fold is None:
            return  # evicted meanwhile
        fold.name = name
        fold.written = max(fold.written, write.count)
        self._settle(fold, now + self.update_every)

    def failed(self, write: Write, now: float, *, gone: bool = False) -> None:
        """The write failed: try again after ``update_every``; ``gone``: the Event object
        no longer exists (expired), so the next write creates a new one."""
        fold = self._folds.get(write.key)
        if fold is None:
            return
        if gone:
            fold.name, fold.written = "", 0
        self._settle(fold, now + self.update_every)

    def _settle(self, fold: Fold, due_at: float) -> None:
        fold.due_at = due_at
        if fold.dirty:
            self._dirty[fold.key] = None
            self._schedule(fold)
        else:
            self._dirty.pop(fold.key, None)

    def _schedule(self, fold: Fold) -> None:
        if fold.due_at != float("inf"):
            self._sequence += 1
            heapq.heappush(self._timers, (fold.due_at, self._sequence, fold.key))

    def _drop_stale(self) -> None:
        while self._timers:
            at, _, key = self._timers[0]
            fold = self._folds.get(key)
            if fold is not None and fold.due_at == at and key in self._dirty:
                return
            heapq.heappop(self._timers)

    def _write(self, fold: Fold) -> Write:
        return Write(fold.key, fold.first, fold.count, fold.last, fold.name)

    def _bucket(self, object_id: str, now: float) -> Bucket:
        bucket = self._buckets.get(object_id)
        if bucket is None:
            bucket = Bucket(tokens=float(self.burst), stamp=now)
            self._buckets[object_id] = bucket
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(object_id)
        return bucket

    def _evict(self) -> None:
        key, fold = self._folds.popitem(last=False)
        if fold.dirty:
            self.evicted += 1
        self._dirty.pop(key, None)
