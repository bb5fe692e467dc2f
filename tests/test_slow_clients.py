"""Issue 18, item 6: every HTTP listener drops a client that has not delivered its whole
request (TLS handshake, head, body) within ``request_timeout``, holds at most
``max_pending_connections`` such clients (the oldest go first), and meanwhile answers a
well-behaved client at once. Each test floods one listener kind with 300 connections from
127.0.0.1 that trickle a partial head or body; every one must be closed within the bound.

Before: the extender held a trickling body for 10 s (and then answered), the node agent
kept one for 10 s after answering (aiohttp's lingering), a TLS listener waited 60 s for a
handshake, and nothing limited how many were open.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _sched_helpers import FakeClock, running_scheduler, scheduler_config

from hami import config
from hami.kube.client import Kube
from hami.listener import Limits
from hami.node import http as node_http
from hami.node.metrics import NodeMetrics
from hami.testkit.controlplane import CertificateAuthority

TIMEOUT = 2.0  # request_timeout of the listeners under test
CAP = 100  # their max_pending_connections
FLOOD = 300
SLACK = 1.5  # a busy 2-core machine may run a due timer this late
TRICKLE = 0.25  # a slow client sends one byte this often

PARTIAL_HEAD = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: applica"


def partial_body(verb: str, path: str) -> bytes:
    return f"{verb} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{{".encode()


@dataclass
class Flood:
    """Slow clients, each noting how long its connection lived (connect to close)."""

    port: int
    lifetimes: list[float] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self, requests: list[bytes | None], tls: ssl.SSLContext | None = None) -> None:
        """``None`` in ``requests``: a raw TCP client that trickles bytes where a TLS
        listener waits for its handshake; the others complete TLS when ``tls`` is given."""
        for i in range(FLOOD):
            request = requests[i % len(requests)]
            context = tls if request is not None else None
            self.tasks.append(asyncio.create_task(self._client(request or b"\x16", context)))

    async def _client(self, request: bytes, tls: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=tls)
        except OSError:  # dropped during its TLS handshake
            await self._closed(loop.time() - started)
            return

        async def trickle() -> None:
            try:
                writer.write(request)
                while True:
                    await asyncio.sleep(TRICKLE)
                    writer.write(b" ")
                    await writer.drain()
            except OSError:
                pass  # the server dropped us; the read below sees it

        sender = asyncio.create_task(trickle())
        try:
            while await reader.read(65536):
                pass  # an answer (old code answered a late body) is not a close
        except OSError:
            pass  # reset: the server aborted the connection
        await self._closed(loop.time() - started)
        sender.cancel()
        writer.close()

    async def _closed(self, lifetime: float) -> None:
        async with self.changed:
            self.lifetimes.append(lifetime)
            self.changed.notify_all()

    async def wait_closed(self, count: int, within: float) -> None:
        async with asyncio.timeout(within), self.changed:
            await self.changed.wait_for(lambda: len(self.lifetimes) >= count)

    async def check(self, good: Any) -> None:
        """The oldest are dropped once more than CAP wait; ``good()`` (a normal request)
        is answered quickly meanwhile; every slow client is gone within the timeout."""
        try:
            # Before: nothing closed until the first deadline (5 s or more).
            await self.wait_closed(FLOOD - CAP, TIMEOUT)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await asyncio.wait_for(good(), 5)
            assert loop.time() - started < 1.0, "a normal request waited behind slow clients"
            await self.wait_closed(FLOOD, TIMEOUT + SLACK + 5)
            assert max(self.lifetimes) <= TIMEOUT + SLACK, sorted(self.lifetimes)[-5:]
        finally:
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)


# ---------------------------------------------------------------- node agent: /healthz, /metrics


async def test_node_listener_drops_slow_clients() -> None:
    listener, port = await node_http.start(
        node_http.make_app(NodeMetrics(), lambda: {"node": "n"}),
        "127.0.0.1",
        0,
        Limits(TIMEOUT, CAP),
    )
    try:
        flood = Flood(port)
        flood.start([partial_body("GET", "/healthz"), PARTIAL_HEAD])

        async def good() -> None:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{port}/healthz") as r,
            ):
                assert r.status == 200

        await flood.check(good)
        assert listener.dropped >= FLOOD - CAP  # some are closed by the lingering read instead
    finally:
        await listener.close()


# ---------------------------------------------------------------- scheduler role


def _limits(**section: Any) -> dict[str, Any]:
    return {**section, "request_timeout": f"{TIMEOUT}s", "max_pending_connections": CAP}


FILTER_ARGS = {"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "NodeNames": []}


@pytest.mark.controlplane
async def test_scheduler_extender_and_probe_listeners_drop_slow_clients(kube: Kube) -> None:
    cfg = scheduler_config(
        http=_limits(address="127.0.0.1", port=0),
        extender=_limits(address="127.0.0.1", port=0),
    )
    async with running_scheduler(kube, FakeClock(), cfg) as role, aiohttp.ClientSession() as s:

        async def good_filter() -> None:
            async with s.post(f"{role.url}/filter", json=FILTER_ARGS) as r:
                assert (await r.json())["Error"] == ""

        async def good_probe() -> None:
            async with s.get(f"{role.probe_url}/readyz") as r:
                assert r.status == 200

        for url, good, request in (
            (role.url, good_filter, partial_body("POST", "/filter")),
            (role.probe_url, good_probe, partial_body("GET", "/metrics")),
        ):
            flood = Flood(int(url.rsplit(":", 1)[1]))
            flood.start([request, PARTIAL_HEAD])
            await flood.check(good)
        assert all(listener.dropped >= FLOOD - CAP for listener in role.listeners)


@pytest.mark.controlplane
async def test_scheduler_webhook_listener_drops_slow_clients(kube: Kube, tmp_path: Path) -> None:
    ca = CertificateAuthority("webhook-ca")
    cert, key = ca.issue("hami-scheduler", hosts=["127.0.0.1"], server=True)
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    webhook = {
        "enabled": True,
        "address": "127.0.0.1",
        "port": 0,
        "tls_mode": "files",
        "cert_file": str(tmp_path / "tls.crt"),
        "key_file": str(tmp_path / "tls.key"),
    }
    cfg = scheduler_config(webhook=_limits(**webhook))
    client_tls = ssl.create_default_context(cadata=ca.cert_pem.decode())
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "operation": "CREATE", "object": {"spec": {"containers": []}}},
    }
    async with running_scheduler(kube, FakeClock(), cfg) as role, aiohttp.ClientSession() as s:
        url = role.webhook_url
        assert url is not None

        async def good() -> None:
            async with s.post(url, json=review, ssl=client_tls) as r:
                assert (await r.json())["response"]["uid"] == "u"

        flood = Flood(int(url.rsplit(":", 1)[1].split("/")[0]))
        # Mostly clients that never finish their TLS handshake (cheap for the test's own
        # CPU), and some that do and then trickle their body. Before: 60 s for a handshake.
        flood.start([None] * 9 + [partial_body("POST", "/webhook")], tls=client_tls)
        await flood.check(good)


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("request_timeout", "0s", "request_timeout: expected a positive duration"),
        ("max_pending_connections", 0, "max_pending_connections: expected an integer >= 1"),
    ],
)
@pytest.mark.parametrize("section", ["http", "extender", "webhook"])
def test_listener_limits_are_checked(section: str, key: str, value: Any, error: str) -> None:
    with pytest.raises(config.ConfigError, match=f"scheduler.{section}.{error}"):
        scheduler_config(**{section: {key: value}})
    with pytest.raises(config.ConfigError, match=f"node.http.{error}"):
        config.from_mapping({"node": {"http": {key: value}}}, env={})
