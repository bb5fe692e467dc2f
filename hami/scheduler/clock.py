"""The scheduler role's time sources, replaceable in tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Clock:
    """Wall time (annotations, lock values) and monotonic time (waits, deadlines)."""

    now: Callable[[], datetime] = utcnow
    monotonic: Callable[[], float] = time.monotonic
