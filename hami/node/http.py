"""The node agent's small HTTP endpoint: ``/healthz`` and ``/metrics`` (aiohttp)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from hami.node.metrics import NodeMetrics

# Seconds from connect (or the last answer) to a complete request head: slow or idle
# clients of this 0.0.0.0 port are closed instead of holding connections open.
HEADER_TIMEOUT = 5.0


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


async def start(app: web.Application, address: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app``; returns the runner (to clean up) and the bound port (for port 0)."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=HEADER_TIMEOUT)
    await runner.setup()
    try:
        await web.TCPSite(runner, address, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])
