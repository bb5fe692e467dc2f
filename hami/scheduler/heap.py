"""Settle the garbage collector once the initial lists are in (issue 20 item 2).

The node and pod state of a large cluster is millions of container objects (65,000
nodes x 8 devices, half a million pod records) that live as long as the process. With
CPython's defaults every full collection walks all of them (2.3 s at 65,000 nodes, 5 M
tracked objects), and young collections run every 700 allocations. ``settle`` moves what
exists once both reflectors have listed into the permanent generation (``gc.freeze``):
collections no longer walk it, while objects made later (watch events, filter calls,
relists) are tracked and collected as before. ``freeze_listed`` does the same after each
page of the initial lists (the reflectors' ``after_initial_page``), so the full passes
CPython runs while the lists go in walk only the page just handed over, not everything
listed before it (2-4 s passes at 65,000 nodes otherwise). Frozen objects that become garbage are
still freed by reference counting (the state holds no reference cycles); only a cycle
among frozen objects would stay, and the state makes none.
"""

from __future__ import annotations

import gc

# Young collections every THRESHOLD allocations (CPython: 700): each walks only the young
# objects, so fewer, larger passes cost the same in total and stay short (see
# docs/performance.md, "Garbage collector"). Middle and full collections as CPython's.
THRESHOLD = (10_000, 10, 10)


def settle() -> None:
    """Freeze what exists now (after the initial lists), and raise the young threshold.

    Collects the young generations first so their garbage is not frozen with them; a full
    collection here would walk every object once (seconds at 65,000 nodes) for the little
    garbage the lists leave, which reference counting already freed.
    """
    gc.collect(1)
    gc.freeze()
    gc.set_threshold(*THRESHOLD)


def freeze_listed() -> None:
    """Freeze what the initial lists have built so far (after each page).

    Each call walks only what was made since the last one (one page's state, a few ms),
    and collects it first so the page's garbage cycles are not frozen for good.
    """
    gc.collect(1)
    gc.freeze()
