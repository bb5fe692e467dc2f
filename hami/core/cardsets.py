"""Kunlunxin card sets: which cards of an 8-card node a request for 1, 2, 4 or 8 gets, as
Go HAMi 2.10 chooses them for Kunlunxin XPUs (its ``kunlun`` and ``XPU`` device types).

Pure. What is modelled, exactly as Go decides (facts of its behaviour, not its code):

- The node's cards, in the order the scheduler lists them, form two wings: the first four
  positions and the rest. Only cards that fit the request (``fits``) count.
- 1, 2 or 4 cards: when a wing has at least that many fitting cards, the wing whose number
  of fitting cards matches best is used, the left one first at a tie; "best" is, for 2 or 4
  cards, the fewest fitting cards that still suffice (2, 3, then 4), and for one card 1,
  then 3, then 2, then 4 fitting cards. The request takes the first fitting cards of that
  wing in order.
- Otherwise (no wing matches) 2 cards take the first pair, in list order, that sits on one
  of the links 0-4, 1-5, 2-6, 3-7 (card indices); 4 cards, when 4 or 5 cards fit, take the
  first of the groups 0-1-4-5, 2-3-6-7, 0-2-4-6, 1-3-5-7, 0-3-4-7, 1-2-5-6 all of whose
  cards fit; when 6 fit, the first such group after which two of the cards left are linked
  (a cross link above or a link inside a wing: 0-1, 0-2, 0-3, 1-2, 1-3, 2-3 and the same
  among 4-7), else the last group that fits.
- 8 cards: all of 0-7, when every card fits.
- Any other count (3, 5, 6, 7, or more than 8) never fits.

What is not modelled: Go's node score for Kunlunxin (how many half-used wings a decision
leaves) orders nodes, not cards; the node policy here orders nodes as for every vendor.
"""

from __future__ import annotations

from collections.abc import Sequence

WING = 4  # cards per wing
CROSS_LINKS = ((0, 4), (1, 5), (2, 6), (3, 7))
WING_LINKS = tuple(
    (a + base, b + base) for base in (0, 4) for a in range(4) for b in range(a + 1, 4)
)
GROUPS_OF_FOUR = (
    (0, 1, 4, 5),
    (2, 3, 6, 7),
    (0, 2, 4, 6),
    (1, 3, 5, 7),
    (0, 3, 4, 7),
    (1, 2, 5, 6),
)
ONE_CARD_ORDER = (1, 3, 2, 4)  # fitting cards in a wing, best first, for one card


def choose(indices: Sequence[int], fits: Sequence[bool], count: int) -> list[int]:
    """The card indices a request for ``count`` cards gets; [] when it does not fit.

    ``indices`` are the cards' indices in the scheduler's order, ``fits`` whether each
    fits the request on its own."""
    left = sum(1 for position, ok in enumerate(fits) if ok and position < WING)
    right = sum(1 for position, ok in enumerate(fits) if ok and position >= WING)
    if count == 8:
        return list(range(8)) if left + right == count else []
    if count not in (1, 2, 4):
        return []
    if left >= count or right >= count:
        wanted = ONE_CARD_ORDER if count == 1 else tuple(range(count, WING + 1))
        for number in wanted:
            if left == number:
                return _first(indices, fits, 0, count)
            if right == number:
                return _first(indices, fits, WING, count)
    return _linked(indices, fits, count)


def _first(indices: Sequence[int], fits: Sequence[bool], start: int, count: int) -> list[int]:
    chosen: list[int] = []
    for position in range(start, min(len(indices), 8)):
        if fits[position]:
            chosen.append(indices[position])
            if len(chosen) == count:
                break
    return chosen


def _linked(indices: Sequence[int], fits: Sequence[bool], count: int) -> list[int]:
    free = [index for index, ok in zip(indices, fits, strict=True) if ok]
    if count == 2:
        for a in free:
            for b in free:
                if a != b and ((a, b) in CROSS_LINKS or (b, a) in CROSS_LINKS):
                    return [a, b]
        return []
    if count != 4:
        return []
    have = set(free)
    if len(free) in (4, 5):
        for group in GROUPS_OF_FOUR:
            if have.issuperset(group):
                return list(group)
    if len(free) == 6:
        found: list[int] = []
        for group in GROUPS_OF_FOUR:
            if have.issuperset(group):
                found = list(group)
                rest = {index for index in free if index not in group}
                if any(rest.issuperset(link) for link in (*CROSS_LINKS, *WING_LINKS)):
                    return found
        return found
    return []
