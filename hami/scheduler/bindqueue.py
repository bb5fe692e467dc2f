"""Binds wait their turn per node, first come first served.

Only one bind per node works at a time (it takes the node's ``hami.io/mutex.lock``, writes
the pod, creates the Binding); the others wait in a FIFO and do nothing. The one at the
head waits for the node's lock to change (``changed``, called from the Node watch): a
change wakes that one bind only, so a release never sets off a storm of reads and
conditional writes that all but one would lose. When the head's turn ends, the next bind
in line gets its turn.

Pure asyncio, no I/O; the scheduler (``hami.scheduler.service``) drives it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


class QueueTimeout(Exception):
    """The bind's turn did not come in time; ``ahead`` binds were in front of it."""

    def __init__(self, node: str, ahead: int) -> None:
        super().__init__(f"{ahead} bind(s) ahead on node {node}")
        self.node = node
        self.ahead = ahead


@dataclass(eq=False)
class _Line:
    """One node's waiting binds; the head (``waiters[0]``) has the turn."""

    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    generation: int = 0  # lock changes seen while someone waits on this node
    change: asyncio.Future[None] | None = None  # the head waiting for a lock change


class BindQueue:
    def __init__(self) -> None:
        self._lines: dict[str, _Line] = {}
        self.wakes = 0  # heads woken by a lock change (one per change at most)

    def nodes(self) -> list[str]:
        """Nodes with binds in line."""
        return list(self._lines)

    def waiting(self, node: str) -> int:
        """Binds in line for ``node``, the one having its turn included."""
        line = self._lines.get(node)
        return len(line.waiters) if line else 0

    @contextlib.asynccontextmanager
    async def turn(self, node: str, seconds: float) -> AsyncIterator[None]:
        """Wait (at most ``seconds``, else ``QueueTimeout``) until every bind that
        came before on ``node`` is done; the body is this bind's turn."""
        line = self._lines.setdefault(node, _Line())
        me: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line.waiters.append(me)
        try:
            if line.waiters[0] is me:
                me.set_result(None)
            else:
                ahead = len(line.waiters) - 1
                try:
                    await asyncio.wait_for(asyncio.shield(me), seconds)
                except TimeoutError:
                    raise QueueTimeout(node, ahead) from None
            yield
        finally:
            self._leave(node, line, me)

    def _leave(self, node: str, line: _Line, me: asyncio.Future[None]) -> None:
        head = bool(line.waiters) and line.waiters[0] is me
        with contextlib.suppress(ValueError):
            line.waiters.remove(me)
        if head:
            if line.change is not None and not line.change.done():
                line.change.cancel()
            line.change = None
            if line.waiters:
                line.waiters[0].set_result(None)  # exactly the next one in line
        if not line.waiters and self._lines.get(node) is line:
            del self._lines[node]

    def generation(self, node: str) -> int:
        """A mark to pass to ``wait_change``: changes after it are not missed."""
        line = self._lines.get(node)
        return line.generation if line else 0

    def changed(self, node: str) -> bool:
        """The node's lock changed (or the node went away): wake the head, and only it.
        True when a waiting head was woken."""
        line = self._lines.get(node)
        if line is None:
            return False
        line.generation += 1
        change, line.change = line.change, None
        if change is None or change.done():
            return False
        change.set_result(None)
        self.wakes += 1
        return True

    async def wait_change(self, node: str, since: int, seconds: float) -> bool:
        """For the bind having its turn: wait until the node's lock changes after ``since``
        (a ``generation`` mark), at most ``seconds``. False when none came."""
        line = self._lines.get(node)
        if line is None:
            raise RuntimeError(f"wait_change on node {node} outside a turn")
        if line.generation != since:
            return True  # it changed while the caller was reading
        change: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line.change = change
        try:
            await asyncio.wait_for(asyncio.shield(change), seconds)
        except TimeoutError:
            return False
        finally:
            if line.change is change:
                line.change = None
        return True
