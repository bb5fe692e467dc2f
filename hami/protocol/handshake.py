"""Handshake values ``hami.io/node-handshake-{type}`` and the availability rule (section 2).

Pure: the caller passes ``now``; no clock is read here.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

REPORTED = "Reported"
REQUESTING = "Requesting"
DELETED = "Deleted"

_LAYOUTS = ("%Y-%m-%d %H:%M:%S", "%Y.%m.%d %H:%M:%S")  # the second is older HAMi's


class HandshakeState(enum.Enum):
    REPORTED = "reported"
    REQUESTING = "requesting"
    DELETED = "deleted"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Handshake:
    state: HandshakeState
    time: datetime | None = None  # only for REQUESTING: the scheduler's own stamp, UTC


def format_time(now: datetime) -> str:
    """The stamp layout HAMi writes: ``YYYY-MM-DD HH:MM:SS`` in UTC."""
    return now.astimezone(UTC).strftime(_LAYOUTS[0])


def reported(now: datetime) -> str:
    return f"{REPORTED}_{format_time(now)}"


def requesting(now: datetime) -> str:
    return f"{REQUESTING}_{format_time(now)}"


def deleted(now: datetime) -> str:
    return f"{DELETED}_{format_time(now)}"


def parse_handshake(value: str | None) -> Handshake:
    """Classify a handshake value; anything unrecognised is UNKNOWN, never an error."""
    if not value:
        return Handshake(HandshakeState.UNKNOWN)
    if _has_prefix(value, REPORTED):
        return Handshake(HandshakeState.REPORTED)
    if value.startswith(DELETED):
        return Handshake(HandshakeState.DELETED)
    if _has_prefix(value, REQUESTING):
        stamp = _parse_time(value[len(REQUESTING) + 1 :])
        if stamp is not None:
            return Handshake(HandshakeState.REQUESTING, stamp)
    return Handshake(HandshakeState.UNKNOWN)


# The time of a ``Reported`` value as agents write it: ``Reported_2024-01-23 04:30:04``, older
# HAMi's dotted date, or Go's ``time.Time.String()`` (fraction, zone offset, zone name...).
_REPORTED_TIME = re.compile(
    r"(\d{4}[-.]\d{2}[-.]\d{2} \d{2}:\d{2}:\d{2})(?:\.\d+)?(?: ([+-]\d{2})(\d{2})\b)?"
)


def reported_time(value: str | None) -> datetime | None:
    """When a ``Reported`` value says it was written (UTC, by the writer's clock, so only a
    hint: the caller bounds it by when it saw the value); None when it is not a Reported
    value or carries no readable time."""
    if value is None or not _has_prefix(value, REPORTED):
        return None
    match = _REPORTED_TIME.match(value[len(REPORTED) + 1 :].strip())
    if match is None:
        return None
    stamp = _parse_time(match.group(1))
    if stamp is None or match.group(2) is None:
        return stamp
    sign = -1 if match.group(2)[0] == "-" else 1  # "-0030": the minutes are negative too
    offset = sign * timedelta(hours=abs(int(match.group(2))), minutes=int(match.group(3)))
    try:
        return stamp - offset
    except OverflowError:
        return stamp  # year 1 or 9999: the offset changes nothing that matters


def _has_prefix(value: str, word: str) -> bool:
    return value.startswith(word) and value[len(word) : len(word) + 1] in ("_", " ")


def _parse_time(text: str) -> datetime | None:
    for layout in _LAYOUTS:
        try:
            return datetime.strptime(text.strip(), layout).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


@dataclass(frozen=True, slots=True)
class HandshakeDecision:
    """What the scheduler does with one node's type at one pass."""

    available: bool
    write: str | None  # the value to patch in (``Requesting_{now}``), or None to leave it
    reason: str | None  # why unavailable, in filter-reason words


HANDSHAKE_TIMED_OUT = "handshake timed out"
NODE_UNREGISTERED = "node unregistered"
NODE_DELETED = "node deleted its devices"


def decide(
    value: str | None, *, has_register: bool, now: datetime, timeout: timedelta
) -> HandshakeDecision:
    """The table of protocol.md section 2 as a pure function; total for any value and time.

    A stamp more than ``timeout`` ahead of ``now`` is absurd (§2 "Far-off timestamps") and
    is handled like an unparsable value: patch ``Requesting_{now}``, available.
    """
    if value is None:
        if not has_register:
            return HandshakeDecision(False, None, NODE_UNREGISTERED)
        return HandshakeDecision(True, requesting(now), None)
    shake = parse_handshake(value)
    if shake.state is HandshakeState.REPORTED:
        return HandshakeDecision(True, requesting(now), None)
    if shake.state is HandshakeState.REQUESTING and shake.time is not None:
        # Subtract, never add: a stamp in year 9999 plus the timeout overflows.
        age = _as_utc(now) - shake.time
        if age < -timeout:
            # Far ahead of our own clock: not a stamp we wrote now, and honouring it would
            # keep a dead node available for years. Treated like an unparsable value.
            return HandshakeDecision(True, requesting(now), None)
        if age <= timeout:
            return HandshakeDecision(True, None, None)
        return HandshakeDecision(False, None, HANDSHAKE_TIMED_OUT)
    if shake.state is HandshakeState.DELETED:
        return HandshakeDecision(False, None, NODE_DELETED)
    return HandshakeDecision(True, requesting(now), None)


def _as_utc(now: datetime) -> datetime:
    return now if now.tzinfo is not None else now.replace(tzinfo=UTC)


def is_available(value: str | None, now: datetime, timeout: timedelta) -> bool:
    """Availability alone, for a node whose register value exists."""
    return decide(value, has_register=True, now=now, timeout=timeout).available
