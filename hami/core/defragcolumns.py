"""What the ``defrag`` policy keeps per node, as columns (numpy arrays indexed by a slot
per node), so that a decision weighs the named nodes with a few array operations instead
of a pass of Python per name (``hami.core.defragpolicy._scan``).

Pure. A slot's columns are valid while its stamp is the one they were filled at: a node
that changes gets a new stamp (one integer written, whatever is kept for it), and a new
generation of the window's weights stamps every slot anew.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

_FIRST_CAPACITY = 1024

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


def _grown(array: npt.NDArray[Any], capacity: int, fill: float | int) -> npt.NDArray[Any]:
    bigger = np.full(capacity, fill, dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger


class NodeColumns:
    """Per node, independent of what is asked: its key's number, its free cores, its
    free CPU and memory (infinite where unknown), whether that is known, the cores that
    room starves now and -utilisation; and each slot's stamp."""

    def __init__(self) -> None:
        self.slot_of: dict[str, int] = {}
        self.name_of: list[str | None] = []
        self._free_slots: list[int] = []
        self.capacity = 0
        self.stamp: Ints = np.zeros(0, dtype=np.int64)
        self.built: Ints = np.zeros(0, dtype=np.int64)  # the stamp the row was filled at
        self.number: Ints = np.zeros(0, dtype=np.int64)
        self.free: Floats = np.zeros(0)
        self.cpu: Floats = np.zeros(0)
        self.memory: Floats = np.zeros(0)
        self.known: npt.NDArray[np.bool_] = np.zeros(0, dtype=np.bool_)
        self.starved_before: Floats = np.zeros(0)
        self.neg_util: Floats = np.zeros(0)
        self.live: npt.NDArray[np.bool_] = np.zeros(0, dtype=np.bool_)  # a node has the slot
        self._grow(_FIRST_CAPACITY)

    def _grow(self, capacity: int) -> None:
        self.stamp = _grown(self.stamp, capacity, 1)  # rows start stale: built is 0
        self.built = _grown(self.built, capacity, 0)
        self.number = _grown(self.number, capacity, 0)
        self.free = _grown(self.free, capacity, 0.0)
        self.cpu = _grown(self.cpu, capacity, 0.0)
        self.memory = _grown(self.memory, capacity, 0.0)
        self.known = _grown(self.known, capacity, False)
        self.starved_before = _grown(self.starved_before, capacity, 0.0)
        self.neg_util = _grown(self.neg_util, capacity, 0.0)
        self.live = _grown(self.live, capacity, False)
        self.name_of.extend([None] * (capacity - self.capacity))
        self.capacity = capacity

    def add(self, name: str) -> int:
        """The slot of ``name``, given one if it has none."""
        slot = self.slot_of.get(name)
        if slot is not None:
            return slot
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = len(self.slot_of)
            if slot >= self.capacity:
                self._grow(2 * self.capacity)
        self.slot_of[name] = slot
        self.name_of[slot] = name
        self.live[slot] = True
        return slot

    def remove(self, name: str) -> None:
        slot = self.slot_of.pop(name, None)
        if slot is not None:
            self.stamp[slot] += 1  # what was kept for the slot is not its next node's
            self.name_of[slot] = None
            self.live[slot] = False
            self._free_slots.append(slot)

    def changed(self, name: str) -> None:
        slot = self.slot_of.get(name)
        if slot is not None:
            self.stamp[slot] += 1

    def all_changed(self) -> None:
        self.stamp += 1

    def fill(
        self,
        slot: int,
        number: int,
        free: int,
        room: tuple[int, int] | None,
        starved_before: float,
        neg_util: float,
    ) -> None:
        self.number[slot] = number
        self.free[slot] = free
        if room is None:
            self.cpu[slot] = self.memory[slot] = np.inf
            self.known[slot] = False
            self.starved_before[slot] = 0.0
        else:
            self.cpu[slot], self.memory[slot] = room
            self.known[slot] = True
            self.starved_before[slot] = starved_before
        self.neg_util[slot] = neg_util
        self.built[slot] = self.stamp[slot]

    def is_built(self, slot: int) -> bool:
        return bool(self.built[slot] == self.stamp[slot])


class AskColumns:
    """Per node, for one request (what is asked, whatever the pod's CPU and memory): the
    answer where the pod leaves every shape's pod room (its cost, NaN where nothing fits,
    the device model the pressure term charges, by number, and the device key to take),
    the free cores the pod leaves (0 where the node's room is unknown), and the stamp
    the row was filled at."""

    def __init__(self, capacity: int) -> None:
        self.built: Ints = np.zeros(capacity, dtype=np.int64)
        self.cost: Floats = np.full(capacity, np.nan)
        self.model: Ints = np.zeros(capacity, dtype=np.int64)
        self.left: Floats = np.zeros(capacity)
        self.pick: list[Any] = [None] * capacity

    @property
    def capacity(self) -> int:
        return len(self.built)

    def grow(self, capacity: int) -> None:
        if capacity > self.capacity:
            self.pick.extend([None] * (capacity - self.capacity))
            self.built = _grown(self.built, capacity, 0)
            self.cost = _grown(self.cost, capacity, np.nan)
            self.model = _grown(self.model, capacity, 0)
            self.left = _grown(self.left, capacity, 0.0)
