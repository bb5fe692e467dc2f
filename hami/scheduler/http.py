"""The scheduler's HTTP surface (aiohttp): extender verbs, probes, metrics, explain, webhook.

kube-scheduler treats a non-200 answer as a failed extender, so the extender verbs always
answer 200 with any error in ``Error``. Request bodies are capped (``MAX_BODY``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from hami import log
from hami.scheduler.metrics import CONTENT_TYPE
from hami.scheduler.service import Scheduler
from hami.scheduler.webhook import review

_log = log.get(__name__)
MAX_BODY = 16 * 1024 * 1024  # 5000 node names are ~100 KiB; pods with big specs fit too

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _json_body(request: web.Request) -> tuple[Any, str | None]:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return None, f"request body larger than {MAX_BODY} bytes"
    try:
        return json.loads(raw), None
    except (ValueError, RecursionError) as exc:
        return None, f"request body is not JSON: {exc}"


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
    )


def build_app(
    scheduler: Scheduler, scheduler_name: str, *, extender: bool = True
) -> web.Application:
    """The application; ``extender=False`` gives the webhook-only app (the TLS port)."""
    app = web.Application(client_max_size=MAX_BODY)

    async def filter_(request: web.Request) -> web.Response:
        if not scheduler.ready:
            return _json(
                {
                    "NodeNames": [],
                    "FailedNodes": {},
                    "Error": "hami scheduler is starting: node and pod state not synced yet",
                }
            )
        body, error = await _json_body(request)
        if error is not None:
            return _json({"NodeNames": [], "FailedNodes": {}, "Error": error})
        return _json(await scheduler.filter(body))

    async def bind(request: web.Request) -> web.Response:
        body, error = await _json_body(request)
        if error is not None:
            return _json({"Error": error})
        return _json(await scheduler.bind(body))

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        if scheduler.ready:
            return web.Response(text="ok")
        return web.Response(text="node and pod state not synced yet", status=503)

    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=scheduler.metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    async def explain(request: web.Request) -> web.Response:
        name = request.query.get("name", "")
        namespace = request.query.get("namespace", "default")
        if not name:
            return _json({"error": "query parameter 'name' is required"}, status=400)
        try:
            return _json(await scheduler.explain(namespace, name))
        except Exception as exc:
            return _json({"pod": f"{namespace}/{name}", "error": str(exc), "nodes": {}}, 404)

    async def webhook(request: web.Request) -> web.Response:
        body, error = await _json_body(request)
        if error is not None:
            return _json({"error": error}, status=400)
        return _json(review(body, scheduler.kinds, scheduler_name))

    app.router.add_post("/webhook", webhook)
    app.router.add_get("/healthz", healthz)
    if extender:
        app.router.add_post("/filter", filter_)
        app.router.add_post("/bind", bind)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/explain", explain)
    return app
