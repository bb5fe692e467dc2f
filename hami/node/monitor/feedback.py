"""HAMi's priority feedback, as a pure function over the regions' state.

HAMi-core sets ``recent_kernel`` (to a small positive count) when its container launches a
kernel and reads two fields the monitor writes: ``recent_kernel < 0`` blocks kernel
launches, ``utilization_switch == 1`` makes the limiter throttle to the core limit. Each
round (Go HAMi's ``cmd/vGPUmonitor/feedback.go``, every 5 s):

1. every positive ``recent_kernel`` is decremented; a container still positive after that
   is *active* on each of its devices, counted by its priority (0 is highest);
2. a container is *blocked* (``recent_kernel`` -1) while a container of a higher priority
   (a smaller number) is active on one of its devices, and unblocked (0) when none is;
3. its ``utilization_switch`` is 1 while it is blocked or more than one container of its
   own priority is active on one of its devices (they share the device by the limit), else
   0.

A negative priority takes no part (never counted, never blocked).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class FeedbackState:
    priority: int
    recent_kernel: int
    utilization_switch: int
    uuids: Sequence[str]  # the devices of the region that have a UUID


@dataclass(frozen=True, slots=True)
class FeedbackWrite:
    recent_kernel: int | None  # the new value to write, None to leave it
    utilization_switch: int | None


def plan_feedback(states: Mapping[K, FeedbackState]) -> dict[K, FeedbackWrite]:
    """The writes of one round, for the containers whose fields change."""
    decayed = {key: _decay(s.recent_kernel) for key, s in states.items()}
    active: Counter[tuple[str, int]] = Counter()  # (uuid, priority) -> active containers
    for key, state in states.items():
        if decayed[key] > 0 and state.priority >= 0:
            for uuid in state.uuids:
                active[uuid, state.priority] += 1
    by_uuid: dict[str, list[tuple[int, int]]] = {}
    for (uuid, priority), count in active.items():
        by_uuid.setdefault(uuid, []).append((priority, count))

    writes: dict[K, FeedbackWrite] = {}
    for key, state in states.items():
        recent = decayed[key]
        blocked = _outranked(by_uuid, state)
        if blocked and recent >= 0:
            recent = -1
        elif not blocked and recent < 0:
            recent = 0
        switch = 1 if blocked or _crowded(by_uuid, state) else 0
        write = FeedbackWrite(
            recent if recent != state.recent_kernel else None,
            switch if switch != state.utilization_switch else None,
        )
        if write.recent_kernel is not None or write.utilization_switch is not None:
            writes[key] = write
    return writes


def _decay(recent: int) -> int:
    return recent - 1 if recent > 0 else recent


def _outranked(by_uuid: Mapping[str, list[tuple[int, int]]], state: FeedbackState) -> bool:
    return any(
        p < state.priority and count > 0
        for uuid in state.uuids
        for p, count in by_uuid.get(uuid, ())
    )


def _crowded(by_uuid: Mapping[str, list[tuple[int, int]]], state: FeedbackState) -> bool:
    return state.priority >= 0 and any(
        p == state.priority and count > 1
        for uuid in state.uuids
        for p, count in by_uuid.get(uuid, ())
    )
