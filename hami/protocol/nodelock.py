"""The node lock ``hami.io/mutex.lock: {RFC3339},{namespace},{pod}`` (protocol.md section 5).

Codec and time arithmetic only; the staleness rule that also looks at the lock's pod is
``hami.kube.nodelock``. Every time computation here is total: a time that is valid text
but absurd (year 9999, or so far off that adding a timeout overflows) is treated like an
unparsable one, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

DEFAULT_LOCK_TIMEOUT = timedelta(minutes=5)
# How far in the future a lock or bind time may lie (clocks of two writers differ a little);
# anything further is absurd and counts as malformed, so it cannot hold a node for years.
MAX_SKEW = timedelta(minutes=10)

# RFC 3339 as Go's time.RFC3339 writes it (optionally with fractions); the zone may be
# ``Z`` or an offset (Go HAMi writes its local offset). A missing zone is read as UTC.
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})?",
    re.ASCII,
)


def rfc3339(time: datetime) -> str:
    """Second-precision UTC RFC 3339, as Go's ``time.RFC3339`` and Kubernetes timestamps."""
    return time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> datetime | None:
    """An aware UTC time, or None when the text is not RFC 3339 or not representable."""
    if not _RFC3339.fullmatch(text):
        return None
    fraction = re.search(r"\.(\d+)", text)
    if fraction and len(fraction.group(1)) > 6:  # Go writes nanoseconds; Python takes micro
        text = text.replace(fraction.group(0), "." + fraction.group(1)[:6], 1)
    try:
        stamp = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
        if stamp.tzinfo is None:
            return stamp.replace(tzinfo=UTC)
        return stamp.astimezone(UTC)
    except (ValueError, OverflowError):  # e.g. 9999-12-31T23:59:59-01:00 is past year 9999
        return None


def is_sane(time: datetime, now: datetime, timeout: timedelta) -> bool:
    """The time is not further ahead of ``now`` than MAX_SKEW and ``time + timeout`` exists."""
    try:
        return time + timeout >= time and time - now <= MAX_SKEW
    except OverflowError:
        return False


def older_than(time: datetime, now: datetime, timeout: timedelta) -> bool:
    """``now > time + timeout``, total: an absurd time counts as older than any timeout."""
    if not is_sane(time, now, timeout):
        return True
    return now > time + timeout


def parse_unix_time(value: str | None) -> datetime | None:
    """``hami.io/bind-time`` (unix seconds) as an aware time; None when absent or absurd."""
    if not value or len(value) > 20 or not value.isascii() or not value.strip().isdigit():
        return None
    try:
        return datetime.fromtimestamp(int(value), UTC)
    except (ValueError, OverflowError, OSError):
        return None


@dataclass(frozen=True, slots=True)
class NodeLock:
    """A parsed lock. ``namespace`` and ``pod`` are empty for the legacy owner-less form."""

    time: datetime
    namespace: str
    pod: str

    @property
    def owner(self) -> str | None:
        """``namespace/pod``, or None for a legacy lock that names no pod."""
        return f"{self.namespace}/{self.pod}" if self.pod else None

    def encode(self) -> str:
        if not self.pod:
            return rfc3339(self.time)
        return f"{rfc3339(self.time)},{self.namespace},{self.pod}"

    def is_expired(self, now: datetime, timeout: timedelta = DEFAULT_LOCK_TIMEOUT) -> bool:
        """Older than ``timeout``; a time absurdly far off (year 9999) is expired too."""
        return older_than(self.time, now, timeout)


def parse_lock(value: str | None) -> NodeLock | None:
    """The lock, or None when absent or malformed (a malformed lock counts as stale).

    A bare RFC 3339 time is the legacy owner-less form older Go HAMi schedulers write."""
    if not value:
        return None
    parts = value.split(",")
    if len(parts) == 1:
        stamp = parse_rfc3339(parts[0].strip())
        return None if stamp is None else NodeLock(stamp, "", "")
    if len(parts) != 3 or not all(parts):
        return None
    stamp = parse_rfc3339(parts[0])
    if stamp is None:
        return None
    return NodeLock(stamp, parts[1], parts[2])
