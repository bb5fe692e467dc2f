"""Node name -> a small int, looked up for a whole list of names at once.

Pure. A no-fit answer reads every candidate's summary group (``hami.core.nofit``): at
65,000 names a plain dictionary look-up per name costs ~260 ns, because each hit compares
the freshly decoded name with the stored key, scattered over a heap of hundreds of MiB
(~23 ms for the list). Here the stored names' hashes are kept sorted in one array, so a
list is its names' hashes (computed once per string; the answer's dictionary reuses
them) and one binary search over a few hundred KiB.

A name is taken to be a stored one when their 64-bit hashes are equal. Two stored names
with the same hash turn the array off (the dictionary answers instead); a name not
stored that shares a stored name's hash (odds of about one in 2^64 per pair) reads that
name's value. Callers use it where that costs nothing worse than a wrong reason text.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
MISSING = -1  # the value of a name not stored


class NameIndex:
    """A mapping of names to non-negative ints with ``lookup`` for many names at once."""

    def __init__(self) -> None:
        self._values: dict[str, int] = {}
        self._hashes: Ints | None = None  # sorted; None: to be built at the next lookup
        self._by_hash: Ints = np.zeros(0, dtype=np.int64)  # values in the hashes' order
        self._usable = True

    def __len__(self) -> int:
        return len(self._values)

    def get(self, name: str) -> int | None:
        return self._values.get(name)

    def set(self, name: str, value: int) -> None:
        known = name in self._values
        self._values[name] = value
        if not known:
            self._hashes = None  # a new name: built again when next needed
        elif self._hashes is not None and self._usable:
            self._by_hash[self._position(name)] = value

    def pop(self, name: str) -> int | None:
        value = self._values.pop(name, None)
        if value is not None:
            self._hashes = None
        return value

    def _position(self, name: str) -> int:
        assert self._hashes is not None
        return int(np.searchsorted(self._hashes, hash(name)))

    def _build(self) -> Ints:
        names = list(self._values)
        hashes = np.fromiter(map(hash, names), dtype=np.int64, count=len(names))
        order = np.argsort(hashes, kind="stable")
        hashes = hashes[order]
        values = np.fromiter(self._values.values(), dtype=np.int64, count=len(names))
        self._by_hash = values[order]
        self._usable = not bool(len(hashes) > 1 and (hashes[1:] == hashes[:-1]).any())
        self._hashes = hashes
        return hashes

    def prepare(self) -> None:
        """Sort the hashes now if a name came or went since (else the next ``lookup``
        does): ~10 ms at 65,000 names."""
        if self._hashes is None:
            self._build()

    def lookup(self, names: Collection[str]) -> Ints:
        """Each name's value, ``MISSING`` where it has none, in the names' order."""
        hashes = self._hashes if self._hashes is not None else self._build()
        if not self._usable or not len(hashes):
            get = self._values.get
            return np.fromiter(
                (MISSING if v is None else v for v in map(get, names)),
                dtype=np.int64,
                count=len(names),
            )
        asked = np.fromiter(map(hash, names), dtype=np.int64, count=len(names))
        # searched in sorted order (several times faster than the list's random order:
        # each search starts where the last one ended), then put back in the list's
        order = np.argsort(asked)
        where = np.empty_like(order)
        where[order] = np.searchsorted(hashes, asked[order])
        where = where.clip(0, len(hashes) - 1)
        return np.where(hashes[where] == asked, self._by_hash[where], MISSING)
