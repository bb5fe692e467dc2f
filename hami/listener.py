"""Every HTTP listener of the roles: one aiohttp application on one address, where a client
must deliver each whole request (TLS handshake, head and body) within ``request_timeout``
of connecting or of its previous answer, and at most ``max_pending`` connections may owe a
request at once.

aiohttp alone bounds only the wait for a request head (``keepalive_timeout``, armed after
the TLS handshake); a body may trickle for as long as the handler reads it, a TLS handshake
waits asyncio's 60 s, and nothing caps how many such connections stay open. Here each
connection is tracked from ``accept``: pending (its request not yet fully arrived) until a
handler sees the whole body, pending again after the answer. A pending connection is
aborted at its deadline, and when one more would exceed ``max_pending`` the oldest pending
one is aborted instead of the new one being refused, so a flood of slow clients never
keeps a well-behaved one (whose request arrives in milliseconds) out.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

LINGER_SECONDS = 1.0  # reading an unread body after an early answer, before closing

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Limits:
    """What a listener tolerates from a client (config keys ``request_timeout`` and
    ``max_pending_connections`` of each listener's section)."""

    request_timeout: float = 5.0
    max_pending: int = 256


class _Guard:
    """The connections of one listener that owe a request, oldest first."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._loop = asyncio.get_running_loop()
        self._raw: dict[RequestHandler, asyncio.Transport] = {}  # every open connection
        self._pending: OrderedDict[RequestHandler, asyncio.TimerHandle] = OrderedDict()
        self.dropped = 0  # connections aborted for being slow or the oldest pending

    def opened(self, handler: RequestHandler, raw: asyncio.Transport) -> None:
        self._raw[handler] = raw
        self.pending(handler)

    def closed(self, handler: RequestHandler) -> None:
        self._raw.pop(handler, None)
        self.delivered(handler)

    def pending(self, handler: RequestHandler) -> None:
        """The next request (or the rest of this one) is due within the timeout from now."""
        if handler not in self._raw:
            return  # closed already
        self.delivered(handler)
        deadline = self._loop.time() + self.limits.request_timeout
        self._pending[handler] = self._loop.call_at(deadline, self._drop, handler)
        while len(self._pending) > self.limits.max_pending:
            oldest, timer = self._pending.popitem(last=False)
            timer.cancel()
            self._drop(oldest)

    def delivered(self, handler: RequestHandler) -> None:
        timer = self._pending.pop(handler, None)
        if timer is not None:
            timer.cancel()

    def _drop(self, handler: RequestHandler) -> None:
        self._pending.pop(handler, None)
        raw = self._raw.pop(handler, None)
        if raw is not None:
            # abort, not close: close waits for the write buffer a slow reader never drains
            self.dropped += 1
            raw.abort()

    def abort_pending(self) -> None:
        for handler in list(self._pending):
            self._drop(handler)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        protocol = request.protocol
        body = request.content
        answered = False

        def body_arrived() -> None:
            if answered:  # read while lingering after an early answer: the next head is due
                self.pending(protocol)
            else:
                self.delivered(protocol)

        # A handler may run as long as it needs once the whole request is in.
        body.on_eof(body_arrived)
        try:
            return await handler(request)
        except ConnectionError:
            if protocol.transport is not None:
                raise
            # Dropped as slow (or gone) while the handler read its body: nobody to answer,
            # and no traceback per slow client (aiohttp would log one as a handler error).
            return web.Response(status=400)
        finally:
            answered = True
            if body.is_eof() and request.keep_alive:
                self.pending(protocol)


class _App(asyncio.Protocol):
    """Between the transport (TLS or plain) and aiohttp's handler: tells the guard about
    the connection's start and end."""

    def __init__(self, guard: _Guard, handler: RequestHandler, *, tls: bool) -> None:
        self.guard = guard
        self.handler = handler
        self.tls = tls  # then _TLS told the guard at accept, and the deadline runs from there
        self.lost = False
        self._made = False
        # TLS: start_tls hands over what arrived with the client's last handshake flight
        # before it returns the transport; kept until the handler has one.
        self._early: list[bytes] = []
        self._early_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if not self.tls:
            self.guard.opened(self.handler, transport)
        self._made = True
        self.handler.connection_made(transport)
        for data in self._early:
            self.handler.data_received(data)
        self._early.clear()
        if self._early_eof:
            self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.guard.closed(self.handler)
        if self._made:
            self.handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._made:
            self.handler.data_received(data)
        else:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        if self._made:
            self.handler.eof_received()
        else:
            self._early_eof = True
        return None  # the transport closes itself (aiohttp's handler does the same)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()


class _TLS(asyncio.Protocol):
    """The raw side of a TLS connection: the handshake counts as part of the request, so a
    client that never finishes one is dropped and counted like any other slow client."""

    def __init__(self, listener: Listener, app: _App) -> None:
        self.listener = listener
        self.app = app

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # start_tls resumes it; no ClientHello byte is lost
        self.listener.guard.opened(self.app.handler, transport)
        task = asyncio.get_running_loop().create_task(self._handshake(transport))
        self.listener.handshakes.add(task)
        task.add_done_callback(self.listener.handshakes.discard)

    async def _handshake(self, raw: asyncio.Transport) -> None:
        assert self.listener.ssl_context is not None
        try:
            transport = await asyncio.get_running_loop().start_tls(
                raw,
                self.app,
                self.listener.ssl_context,
                server_side=True,
                ssl_handshake_timeout=self.listener.guard.limits.request_timeout,
            )
        except Exception:
            # refused certificate, aborted as slow or evicted, a client that went away (an
            # SSLError, TimeoutError, ConnectionError or, on a closed transport, other)
            self.listener.guard.closed(self.app.handler)
            raw.abort()
            return
        if transport is not None and not self.app.lost:
            # start_tls, made for upgrading a connection, never calls connection_made
            self.app.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        pass  # before the handshake ends: _handshake sees it; after: _App does


class Listener:
    """Serves ``app`` on one address with ``limits`` enforced (see the module's text)."""

    def __init__(
        self, app: web.Application, limits: Limits, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.app = app
        self.limits = limits
        self.ssl_context = ssl_context
        self.handshakes: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._guard: _Guard | None = None

    @property
    def guard(self) -> _Guard:
        assert self._guard is not None, "Listener.start() first"
        return self._guard

    @property
    def dropped(self) -> int:
        """Connections aborted so far for being slow (or the oldest of too many)."""
        return 0 if self._guard is None else self._guard.dropped

    async def start(self, address: str, port: int) -> tuple[str, int]:
        """Listen; returns the bound host and port (for port 0)."""
        guard = self._guard = _Guard(self.limits)
        self.app.middlewares.insert(0, guard.middleware)  # outermost: sees every request
        timeout = self.limits.request_timeout
        # keepalive_timeout: aiohttp's own head deadline, the same bound as the guard's
        options: dict[str, Any] = {
            "access_log": None,
            "keepalive_timeout": timeout,
            "lingering_time": min(LINGER_SECONDS, timeout),
        }
        runner = self._runner = web.AppRunner(self.app, **options)
        await runner.setup()
        server = runner.server
        assert server is not None

        def plain() -> asyncio.Protocol:
            return _App(guard, server(), tls=False)

        def tls() -> asyncio.Protocol:
            return _TLS(self, _App(guard, server(), tls=True))

        try:
            self._server = await asyncio.get_running_loop().create_server(
                plain if self.ssl_context is None else tls, address, port, backlog=512
            )
        except BaseException:
            await runner.cleanup()
            raise
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._guard is not None:
            self._guard.abort_pending()  # slow clients: nothing to finish for them
        for task in list(self.handshakes):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        self._server = self._runner = None
