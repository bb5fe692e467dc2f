"""The scheduler's HTTP surface (aiohttp), as three applications on three listeners:

- extender (``scheduler.extender``, loopback by default): ``/filter``, ``/bind``,
  ``/explain``, and ``/prioritize`` with ``scheduler.dra_score`` (``hami.scheduler.drascore``);
  kube-scheduler in the same pod is its only client;
- probes (``scheduler.http``, all addresses): ``/healthz``, ``/readyz``, ``/metrics``;
- webhook (``scheduler.webhook``, TLS): ``/webhook`` and ``/healthz``.

kube-scheduler treats a non-200 answer as a failed extender, so the extender verbs always
answer 200 with any error in ``Error``. Every body is capped (sized to kube-scheduler's and
the API server's real requests); the listeners (``hami.listener``, started by the role)
drop a client whose whole request has not arrived within the section's ``request_timeout``,
so slow or idle clients cannot hold connections open.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from hami import log
from hami.scheduler.admission import Admission
from hami.scheduler.drascore import DraScore, candidate_names, no_opinion
from hami.scheduler.metrics import CONTENT_TYPE
from hami.scheduler.service import Scheduler
from hami.scheduler.webhook import review

_log = log.get(__name__)

# ExtenderArgs with nodeCacheCapable: the Pod (etcd caps an object at 1.5 MiB) and the node
# names (15,000 names are ~300 KiB).
MAX_BODY = 2 * 1024 * 1024
MAX_BIND_BODY = 64 * 1024  # ExtenderBindingArgs: four short strings
MAX_WEBHOOK_BODY = 3 * 1024 * 1024 + 64 * 1024  # the API server's own request cap, plus the review

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Readiness = Callable[[], str | None]  # None when ready, else why not


class _BodyError(Exception):
    pass


async def _read_body(request: web.Request, cap: int) -> bytes:
    if request.content_length is not None and request.content_length > cap:
        # Answer before reading: a 16 MiB body is never read into memory.
        raise _BodyError(f"request body larger than {cap} bytes")
    parts: list[bytes] = []
    size = 0
    # No timeout here: the listener drops a client whose body is late.
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > cap:
            raise _BodyError(f"request body larger than {cap} bytes")
        parts.append(chunk)
    return b"".join(parts)


async def _json_body(request: web.Request, cap: int) -> tuple[Any, str | None]:
    try:
        raw = await _read_body(request, cap)
    except _BodyError as exc:
        return None, str(exc)
    try:
        # orjson: a 15,000-name body decodes ~10x faster than with the json module; it
        # rejects non-UTF-8 bodies, NaN literals and nesting deeper than 1024 (all ValueError)
        return orjson.loads(raw), None
    except (ValueError, RecursionError) as exc:
        return None, f"request body is not JSON: {exc}"


# Non-str keys are written as strings (as the json module does) rather than refused; NaN
# and infinities become null. The answers are built from str keys and finite numbers anyway.
_DUMP_OPTIONS = orjson.OPT_NON_STR_KEYS


def encode(data: Any) -> bytes:
    """The JSON bytes of an answer (orjson: 15,000 FailedNodes in ~0.25 ms, not ~4.5 ms)."""
    try:
        return orjson.dumps(data, option=_DUMP_OPTIONS)
    except orjson.JSONEncodeError as exc:  # e.g. an int past 64 bits: a bug, said in the answer
        _log.error("answer not encodable as JSON", error=str(exc))
        return orjson.dumps({"Error": f"hami scheduler could not encode its answer: {exc}"})


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(data), status=status, content_type="application/json")


def synced_only(scheduler: Scheduler) -> Readiness:
    """Readiness from the first sync only (the role adds the watches' health)."""

    def ready() -> str | None:
        return None if scheduler.ready else "node and pod state not synced yet"

    return ready


def add_extender_routes(
    app: web.Application, scheduler: Scheduler, ready: Readiness | None = None
) -> None:
    not_ready = ready or synced_only(scheduler)

    async def filter_(request: web.Request) -> web.Response:
        reason = not_ready()
        if reason is not None:
            # kube-scheduler retries the pod later; deciding on a stale picture could
            # over-commit a device.
            refusal = f"hami scheduler is not ready: {reason}"
            return _json({"NodeNames": [], "FailedNodes": {}, "Error": refusal})
        body, error = await _json_body(request, MAX_BODY)
        if error is not None:
            return _json({"NodeNames": [], "FailedNodes": {}, "Error": error})
        return _json(await scheduler.filter(body))

    async def bind(request: web.Request) -> web.Response:
        body, error = await _json_body(request, MAX_BIND_BODY)
        if error is not None:
            return _json({"Error": error})
        return _json(await scheduler.bind(body))

    async def explain(request: web.Request) -> web.Response:
        name = request.query.get("name", "")
        namespace = request.query.get("namespace", "default")
        if not name:
            return _json({"error": "query parameter 'name' is required"}, status=400)
        try:
            return _json(await scheduler.explain(namespace, name))
        except Exception as exc:
            return _json({"pod": f"{namespace}/{name}", "error": str(exc), "nodes": {}}, 404)

    app.router.add_post("/filter", filter_)
    app.router.add_post("/bind", bind)
    app.router.add_get("/explain", explain)


def add_prioritize_route(
    app: web.Application, score: DraScore, ready: Readiness | None = None
) -> None:
    """``POST /prioritize``: the DRA mode's node score. Always 200 with a HostPriorityList
    (no opinion, all 0, when not ready or the body is unreadable): kube-scheduler stays in
    charge either way."""

    async def prioritize(request: web.Request) -> web.Response:
        body, error = await _json_body(request, MAX_BODY)
        if error is not None or not isinstance(body, dict):
            _log.warning("prioritize body unreadable; no score", error=error or "not an object")
            return _json(no_opinion(candidate_names(body if isinstance(body, dict) else {})))
        return _json(score.prioritize(body, ready() if ready is not None else None))

    app.router.add_post("/prioritize", prioritize)


def add_probe_routes(
    app: web.Application, scheduler: Scheduler, ready: Readiness | None = None
) -> None:
    not_ready = ready or synced_only(scheduler)

    async def readyz(request: web.Request) -> web.Response:
        reason = not_ready()
        if reason is None:
            # a standby is ready (it serves the webhook, its picture is warm) but says so
            return web.Response(text="ok" if scheduler.leading else "ok: standby")
        return web.Response(text=reason, status=503)

    async def metrics(request: web.Request) -> web.StreamResponse:
        # Streamed piece by piece: a large cluster's scrape never holds the event loop.
        gzip = "gzip" in request.headers.get("Accept-Encoding", "")
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        if gzip:  # Prometheus asks for it: a fifth of the bytes
            response.headers["Content-Encoding"] = "gzip"
        await response.prepare(request)
        await scheduler.metrics.write_to(response.write, gzip=gzip)
        await response.write_eof()
        return response

    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


def _webhook(
    scheduler: Scheduler,
    scheduler_name: str,
    runtime_class: str = "",
    admission: Admission | None = None,
) -> Handler:
    async def webhook(request: web.Request) -> web.Response:
        body, error = await _json_body(request, MAX_WEBHOOK_BODY)
        if error is not None:
            return _json({"error": error}, status=400)
        if admission is not None:  # both device modes: the namespace decides
            return _json(await admission.review(body))
        return _json(
            review(
                body,
                scheduler.kinds,
                scheduler_name,
                runtime_class,
                route_cpu_pods=scheduler.settings.defrag_cpu_pods,
            )
        )

    return webhook


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def _app() -> web.Application:
    # The handlers read bodies themselves, each with its own cap.
    return web.Application(client_max_size=MAX_WEBHOOK_BODY)


def extender_app(
    scheduler: Scheduler,
    ready: Readiness | None = None,
    score: DraScore | None = None,
    score_ready: Readiness | None = None,
) -> web.Application:
    app = _app()
    add_extender_routes(app, scheduler, ready)
    if score is not None:
        add_prioritize_route(app, score, score_ready or ready)
    return app


def probe_app(scheduler: Scheduler, ready: Readiness | None = None) -> web.Application:
    app = _app()
    add_probe_routes(app, scheduler, ready)
    return app


def webhook_app(
    scheduler: Scheduler,
    scheduler_name: str,
    runtime_class: str = "",
    admission: Admission | None = None,
) -> web.Application:
    app = _app()
    app.router.add_post("/webhook", _webhook(scheduler, scheduler_name, runtime_class, admission))
    app.router.add_get("/healthz", _healthz)
    return app


def build_app(
    scheduler: Scheduler, scheduler_name: str, *, extender: bool = True
) -> web.Application:
    """Every route in one application (tests); ``extender=False`` gives the webhook app."""
    if not extender:
        return webhook_app(scheduler, scheduler_name)
    app = _app()
    add_extender_routes(app, scheduler)
    add_probe_routes(app, scheduler)
    app.router.add_post("/webhook", _webhook(scheduler, scheduler_name))
    return app


class ExtenderTLSError(ValueError):
    """The extender's TLS files cannot be loaded; the message names them and the keys."""


class ClientCertTLS:
    """A server context that requires a client certificate signed by ``client_ca_file``.

    ``maybe_reload()`` (called periodically by the role) loads the files again when any of
    them changed; new connections use them. A broken set is logged and the old one kept."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str) -> None:
        self.files = (cert_file, key_file, client_ca_file)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.verify_mode = ssl.CERT_REQUIRED
        try:
            self._stamp = self._read_stamp()
            self._load()
        except (OSError, ssl.SSLError) as exc:
            raise ExtenderTLSError(
                f"extender TLS: cannot load certificate {cert_file}, key {key_file} or client "
                f"CA {client_ca_file}: {exc}; fix scheduler.extender.tls (or clear it to serve "
                "plain HTTP on loopback)"
            ) from exc

    def _read_stamp(self) -> tuple[tuple[float, int], ...]:
        stats = [os.stat(path) for path in self.files]
        return tuple((st.st_mtime, st.st_size) for st in stats)

    def _load(self) -> None:
        cert_file, key_file, client_ca_file = self.files
        self.context.load_cert_chain(cert_file, key_file)
        self.context.load_verify_locations(cafile=client_ca_file)

    def maybe_reload(self) -> bool:
        try:
            stamp = self._read_stamp()
            if stamp == self._stamp:
                return False
            self._load()
        except (OSError, ssl.SSLError) as exc:
            _log.error("extender TLS reload failed, keeping the old files", error=str(exc))
            return False
        self._stamp = stamp
        _log.info("extender TLS files reloaded", cert=self.files[0])
        return True
