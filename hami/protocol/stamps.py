"""Unix-seconds stamps on pods (``hami.io/vgpu-time``, ``hami.io/bind-time``), read totally.

Any text that is not a plain count of seconds a ``datetime`` can hold (year 9999 at most)
reads as None, never an exception: callers treat it like an absent stamp (protocol.md §2
"Far-off timestamps").
"""

from __future__ import annotations

from datetime import UTC, datetime

_LAST = 253402300799  # 9999-12-31 23:59:59 UTC, the last second a datetime holds


def parse_unix_seconds(text: str | None) -> datetime | None:
    """``"1716199325"`` -> that instant in UTC; None for anything else."""
    if text is None:
        return None
    digits = text.strip()
    if not digits or not digits.isascii() or not digits.isdigit() or len(digits) > 12:
        return None
    seconds = int(digits)
    if seconds > _LAST:
        return None
    return datetime.fromtimestamp(seconds, UTC)
