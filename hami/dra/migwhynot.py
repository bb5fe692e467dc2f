"""Why a request can or cannot take a MIG partition on a node, for ``hami explain`` in DRA
mode. Pure.

A MIG GPU is published as one device per (profile, placement), each consuming the memory
slices its placement covers (``hami.dra.migslices``): two partitions can both be allocated
exactly when they share no slice. So a request for a profile fits a GPU when a placement of
that profile overlaps no allocated partition; a request for a shared GPU (HAMi-core) never
takes a partition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hami.dra.claimasks import Want
from hami.dra.devicepicture import Held, PartView, Taint


def _span(part: PartView) -> str:
    last = part.start + part.size - 1
    return f"slice {part.start}" if last == part.start else f"slices {part.start}-{last}"


def _gpus(parts: Sequence[PartView], driver: str) -> dict[str, list[PartView]]:
    out: dict[str, list[PartView]] = {}
    for part in parts:
        if part.driver == driver:
            out.setdefault(part.uuid, []).append(part)
    return out


def _most_disjoint(free: Sequence[PartView]) -> int:
    """The most placements that can be allocated together (interval scheduling)."""
    count, end = 0, -1
    for part in sorted(free, key=lambda p: p.start + p.size):
        if part.start > end:
            count, end = count + 1, part.start + part.size - 1
    return count


def not_shared(want: Want, parts: Sequence[PartView]) -> list[str]:
    """One line per MIG GPU a request for a shared GPU cannot use."""
    return [
        f"GPU {uuid} is in MIG mode: its partitions are not shared devices, "
        f"{want.label} asks a shared GPU"
        for uuid in _gpus(parts, want.driver)
    ]


def alone(
    want: Want,
    parts: Sequence[PartView],
    holds: Mapping[str, Held],
    blocks: Callable[[Taint], bool],
) -> tuple[int, list[str]]:
    """How many partitions of ``want.mig_profile`` the node can give at once (capped at
    what it asks), and why each MIG GPU that gives none cannot. ``blocks``: whether a
    taint keeps ``want`` off."""
    profile = want.mig_profile
    gpus = _gpus(parts, want.driver)
    if not gpus:
        return 0, [f"the node has no MIG GPU, {want.label} asks a {profile} partition"]
    room = 0
    why: list[str] = []
    for uuid, mine in gpus.items():
        taken = [(p, c) for p in mine for c in (holds.get(p.name) or Held()).claims]
        used = {s for p, _ in taken for s in p.slices}
        offered = [p for p in mine if p.profile == profile]
        if not offered:
            profiles = ", ".join(sorted({p.profile for p in mine}))
            why.append(f"GPU {uuid} offers no {profile} partition (it offers {profiles})")
            continue
        blocking = next((t for p in offered for t in p.taints if blocks(t)), None)
        if blocking is not None:
            why.append(f"GPU {uuid} has the taint {blocking}, which {want.label} does not tolerate")
            continue
        free = [p for p in offered if not used & set(p.slices)]
        fits = _most_disjoint(free)
        if fits:
            room += 1 if want.distinct else fits
            continue
        held = "; ".join(f"{_span(p)} held by claim {c}" for p, c in sorted(taken, key=_start))
        why.append(f"no {profile} placement free on GPU {uuid}: {held}")
    return min(room, want.count), why


def _start(taken: tuple[PartView, str]) -> int:
    return taken[0].start
