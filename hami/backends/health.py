"""Why a device is unhealthy, in one short word, and which Xids count. Pure.

The word is what a device carries in ``Device.unhealthy_reason`` and what the DRA mode
publishes as the value of its ``hami.io/unhealthy`` device taint, so it stays a valid
Kubernetes label value (at most 63 characters of ``[A-Za-z0-9._-]``). Both modes use the
same Xid rule: a critical Xid marks the device unhealthy unless it is an application
error, which says nothing about the GPU itself.
"""

from __future__ import annotations

import re

# Application errors the NVIDIA device plugin skips too: 13 graphics engine exception,
# 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video
# processor exception, 109 context switch timeout.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

UNHEALTHY = "unhealthy"  # no cause known (a backend's plain health event, a config flag)
NVML_UNREADABLE = "nvml-unreadable"  # NVML could not read the device
HEALTH_WATCH_FAILED = "health-watch-failed"  # its health events could not be watched
MPS_DAEMON_DOWN = "mps-daemon-down"  # no MPS control daemon: CUDA would run unlimited

_XID = re.compile(r"xid-(\d+)")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def is_fatal(xid: int, ignored: frozenset[int] = APPLICATION_XIDS) -> bool:
    """True when Xid ``xid`` makes the device unhealthy (not an application error)."""
    return xid not in ignored


def xid_cause(xid: int) -> str:
    return f"xid-{xid}"


def xid_of(cause: str) -> int | None:
    """The Xid a cause word names, None for other causes."""
    match = _XID.fullmatch(cause)
    return int(match.group(1)) if match else None


def label_value(cause: str) -> str:
    """``cause`` when it is a valid label value, else ``unhealthy`` (never an invalid one:
    the API server would refuse the whole slice)."""
    if cause and len(cause) <= 63 and _LABEL_VALUE.fullmatch(cause):
        return cause
    return UNHEALTHY
