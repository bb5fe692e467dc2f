"""The node lock ``hami.io/mutex.lock: {RFC3339},{namespace},{pod}`` (protocol.md section 5)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

DEFAULT_LOCK_TIMEOUT = timedelta(minutes=5)


def rfc3339(time: datetime) -> str:
    """Second-precision UTC RFC 3339, as Go's ``time.RFC3339`` and Kubernetes timestamps."""
    return time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class NodeLock:
    time: datetime
    namespace: str
    pod: str

    def encode(self) -> str:
        return f"{rfc3339(self.time)},{self.namespace},{self.pod}"

    def is_expired(self, now: datetime, timeout: timedelta = DEFAULT_LOCK_TIMEOUT) -> bool:
        return now > self.time + timeout


def parse_lock(value: str | None) -> NodeLock | None:
    """The lock, or None when absent or malformed (a malformed lock counts as stale)."""
    if not value:
        return None
    parts = value.split(",")
    if len(parts) != 3 or not all(parts):
        return None
    try:
        stamp = datetime.fromisoformat(parts[0].replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return NodeLock(stamp, parts[1], parts[2])
