"""Items 1 and 9 of issue 9 for the scheduler role, on the real control plane:

- a long-lived task that dies ends ``hami.scheduler.role.main`` with status 1;
- ``/readyz`` turns 503 (and ``/filter`` refuses) while a watch is broken, and 200 again
  once it streams;
- the extender is its own listener: TLS with required client certificates when
  configured; slow or oversized requests are cut off without stalling the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _sched_helpers import FakeClock, running_scheduler, scheduler_config
from kubernetes_asyncio import client

from hami import config
from hami.kube.client import Kube, load_configuration
from hami.scheduler import http as sched_http
from hami.scheduler import role as role_mod
from hami.scheduler.role import SchedulerRole
from hami.scheduler.service import Scheduler
from hami.testkit.cluster import poll
from hami.testkit.controlplane import CertificateAuthority

pytestmark = pytest.mark.controlplane


# ---------------------------------------------------------------- a task that dies


async def test_a_dying_task_ends_main_with_status_1(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_handshake(self: Scheduler) -> None:
        await self.nodes_synced.wait()
        raise RuntimeError("handshake bug")

    monkeypatch.setattr(Scheduler, "handshake_loop", broken_handshake)
    cfg = config.from_mapping(
        {
            "kubeconfig": str(kubeconfig),
            "scheduler": {
                "http": {"address": "127.0.0.1", "port": 0},
                "extender": {"address": "127.0.0.1", "port": 0},
                "webhook": {"enabled": False},
            },
        },
        env={},
    )
    # Before: the failure was logged and main kept serving (this wait timed out).
    assert await asyncio.wait_for(role_mod.main(cfg), 30) == 1


# ---------------------------------------------------------------- readiness follows the watches


class _Proxy:
    """A TCP proxy to the API server that can be cut (every connection dropped) and resumed."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}


@contextlib.asynccontextmanager
async def _kube_through(proxy: _Proxy, kubeconfig: Path) -> AsyncIterator[Kube]:
    configuration = await load_configuration(str(kubeconfig))
    configuration.host = f"https://127.0.0.1:{proxy.port}"
    async with client.ApiClient(configuration) as api:
        yield Kube(api)


async def test_readyz_follows_the_watches(kubeconfig: Path) -> None:
    configuration = await load_configuration(str(kubeconfig))
    host, _, port = configuration.host.removeprefix("https://").rpartition(":")
    proxy = _Proxy((host, int(port)))
    await proxy.start()
    async with (
        _kube_through(proxy, kubeconfig) as kube,
        SchedulerRole(scheduler_config(), kube, handshake_loop=False, stale_grace=0.2) as role,
        aiohttp.ClientSession() as http,
    ):
        await role.wait_ready()

        async def readyz() -> tuple[int, str]:
            async with http.get(f"{role.probe_url}/readyz") as r:
                return r.status, await r.text()

        assert (await readyz())[0] == 200
        await proxy.cut()  # the API server is unreachable: both watches break

        async def not_ready() -> bool:
            return (await readyz())[0] == 503

        await poll(not_ready, 20, "readyz 503 while the watches are broken")
        assert "watch has been broken" in (await readyz())[1]
        body = {"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "NodeNames": ["a"]}
        async with http.post(f"{role.url}/filter", json=body) as r:
            answer = await r.json()
        assert "not ready" in answer["Error"] and answer["NodeNames"] == []

        await proxy.start()  # same port: the reflectors reconnect

        async def ready() -> bool:
            return (await readyz())[0] == 200

        await poll(ready, 30, "readyz 200 once the watches stream again")
        await proxy.cut()


# ---------------------------------------------------------------- the extender's listener


def _write_pair(directory: Path, name: str, pair: tuple[bytes, bytes]) -> tuple[str, str]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    cert.write_bytes(pair[0])
    key.write_bytes(pair[1])
    return str(cert), str(key)


async def test_tls_extender_requires_a_client_certificate(kube: Kube, tmp_path: Path) -> None:
    ca, other_ca = CertificateAuthority("extender-ca"), CertificateAuthority("stranger-ca")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    cert, key = _write_pair(tmp_path, "server", ca.issue("hami", hosts=["127.0.0.1"], server=True))
    good = _write_pair(tmp_path, "good", ca.issue("kube-scheduler", client=True))
    bad = _write_pair(tmp_path, "bad", other_ca.issue("kube-scheduler", client=True))
    tls = {"cert_file": cert, "key_file": key, "client_ca_file": str(tmp_path / "ca.crt")}
    cfg = scheduler_config(extender={"address": "127.0.0.1", "port": 0, "tls": tls})

    def context(pair: tuple[str, str] | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        if pair is not None:
            ctx.load_cert_chain(*pair)
        return ctx

    body = {"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "NodeNames": ["a"]}
    async with running_scheduler(kube, FakeClock(), cfg) as role:
        assert role.url.startswith("https://127.0.0.1:")

        async def post(pair: tuple[str, str] | None) -> Any:
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"{role.url}/filter", json=body, ssl=context(pair)) as r,
            ):
                return await r.json()

        for pair in (None, bad):
            with pytest.raises(aiohttp.ClientError):
                await post(pair)
        answer = await post(good)
        assert answer["Error"] == ""  # an extender answer, not a TLS failure
        # the probes stay plain HTTP on their own port
        async with aiohttp.ClientSession() as s, s.get(f"{role.probe_url}/readyz") as r:
            assert r.status == 200


def test_tls_extender_config_needs_all_three_files() -> None:
    with pytest.raises(config.ConfigError, match="client_ca_file"):
        scheduler_config(extender={"tls": {"cert_file": "/c", "key_file": "/k"}})


def test_extender_defaults_to_loopback_apart_from_the_probes() -> None:
    cfg = config.from_mapping({}, env={}).scheduler
    assert (cfg.extender.address, cfg.http.address) == ("127.0.0.1", "0.0.0.0")
    assert cfg.extender.port != cfg.http.port


async def _raw(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    return reader, writer


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def test_slow_clients_are_disconnected(kube: Kube) -> None:
    fast = {"address": "127.0.0.1", "port": 0, "request_timeout": "0.5s"}
    cfg = scheduler_config(http=fast, extender=fast)
    async with running_scheduler(kube, FakeClock(), cfg) as role:
        for url in (role.url, role.probe_url):
            # slow-loris: half a request head, then nothing; and an idle connection
            half, _ = await _raw(_port(url), b"POST /filter HTTP/1.1\r\nHost: x\r\n")
            idle, _ = await _raw(_port(url), b"")
            # Before: both stayed open (aiohttp's keep-alive default is over an hour).
            assert await asyncio.wait_for(half.read(), 15) == b""
            assert await asyncio.wait_for(idle.read(), 15) == b""
        # a body that does not arrive in time: the connection is dropped, with no answer
        # (tests/test_slow_clients.py floods every listener)
        head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
        slow, _ = await _raw(_port(role.url), head)
        assert await asyncio.wait_for(slow.read(), 15) == b""


async def test_oversized_body_is_refused_before_it_is_read(kube: Kube) -> None:
    async with running_scheduler(kube, FakeClock()) as role:
        size = 16 * 1024 * 1024
        head = f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode()
        big, big_writer = await _raw(_port(role.url), head)
        # The answer comes before a single body byte is sent: nothing is read or parsed, so
        # the loop is never busy with it. (Before: the server waited for all 16 MiB.)
        status = await asyncio.wait_for(big.readline(), 15)
        assert status.startswith(b"HTTP/1.1 200")
        rest = await asyncio.wait_for(big.read(), 15)
        answer = json.loads(rest.split(b"\r\n\r\n", 1)[1])
        assert answer["Error"] == f"request body larger than {sched_http.MAX_BODY} bytes"
        assert answer["NodeNames"] == []
        big_writer.close()
        # Without a Content-Length the cap holds too (chunked upload), and the probes answer
        # while that upload is still being refused.
        async with aiohttp.ClientSession() as s:

            async def chunks() -> AsyncIterator[bytes]:
                yield b'{"NodeNames": ["'
                for _ in range(sched_http.MAX_BODY // 65536 + 2):
                    yield b"a" * 65536

            upload = asyncio.create_task(_post_stream(s, f"{role.url}/filter", chunks()))
            async with s.get(f"{role.probe_url}/healthz") as r:
                assert r.status == 200
            answer = await asyncio.wait_for(upload, 30)
        assert answer is None or "larger than" in answer["Error"]
        # bind's cap is smaller still: its arguments are four short strings
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{role.url}/bind", data=b"{" + b" " * (128 * 1024) + b"}") as r,
        ):
            assert "larger than" in (await r.json())["Error"]


async def _post_stream(s: aiohttp.ClientSession, url: str, data: Any) -> Any:
    try:
        async with s.post(url, data=data) as r:
            return await r.json()
    except aiohttp.ClientError:
        return None  # the server may close while we are still sending
