"""The node agent's small HTTP endpoint: ``/healthz`` and ``/metrics`` (aiohttp)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from hami.listener import Limits, Listener
from hami.node.metrics import NodeMetrics


def make_app(metrics: NodeMetrics, status: Callable[[], Mapping[str, Any]]) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **status()})

    async def metrics_view(request: web.Request) -> web.Response:
        response = web.Response(body=metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application(client_max_size=64 * 1024)  # GET only: no body worth reading
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_view)
    return app


async def start(
    app: web.Application, address: str, port: int, limits: Limits | None = None
) -> tuple[Listener, int]:
    """Serve ``app``; returns the listener (to close) and the bound port (for port 0).

    ``limits`` (``node.http.request_timeout`` and ``max_pending_connections``): slow or
    idle clients of this 0.0.0.0 port are dropped instead of holding connections open."""
    listener = Listener(app, limits or Limits())
    _, bound = await listener.start(address, port)
    return listener, bound
