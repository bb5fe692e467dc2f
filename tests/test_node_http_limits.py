"""Issue 9, item 9's sibling on the node agent: its 0.0.0.0 /healthz and /metrics port
closes connections that never complete a request (slow-loris) or sit idle."""

from __future__ import annotations

import asyncio

from hami.listener import Limits
from hami.node import http
from hami.node.metrics import NodeMetrics


async def test_half_requests_and_idle_connections_are_closed() -> None:
    listener, port = await http.start(
        http.make_app(NodeMetrics(), lambda: {"node": "n"}), "127.0.0.1", 0, Limits(0.5)
    )
    try:
        half_r, half_w = await asyncio.open_connection("127.0.0.1", port)
        half_w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        await half_w.drain()
        idle_r, _ = await asyncio.open_connection("127.0.0.1", port)
        # Before: both stayed open (aiohttp's keep-alive default is over an hour).
        assert await asyncio.wait_for(half_r.read(), 15) == b""
        assert await asyncio.wait_for(idle_r.read(), 15) == b""
        ok_r, ok_w = await asyncio.open_connection("127.0.0.1", port)
        ok_w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await asyncio.wait_for(ok_r.read(), 15)).startswith(b"HTTP/1.1 200")
    finally:
        await listener.close()
