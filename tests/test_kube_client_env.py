"""The API client reads the proxy environment once, not per request (hami.kube.client).

kubernetes_asyncio's session has ``trust_env=True``: aiohttp then sends every request
through two worker-thread look-ups (netrc, proxy variables). ``open_client`` resolves the
proxy once and turns the per-request look-ups off; a proxy named in the environment when
the client is made must still carry the requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from hami.kube.client import env_proxy, open_client

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture
def clean_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_env_proxy_names_the_proxy_once_and_honours_no_proxy(
    clean_proxy_env: pytest.MonkeyPatch,
) -> None:
    server = "https://10.1.2.3:6443"
    assert env_proxy(server) is None
    clean_proxy_env.setenv("HTTPS_PROXY", "http://user:secret@proxy.example:3128")
    assert env_proxy(server) == "http://user:secret@proxy.example:3128"
    clean_proxy_env.setenv("NO_PROXY", "10.1.2.3")
    assert env_proxy(server) is None


async def test_the_session_does_no_per_request_environment_lookups(
    kubeconfig: Any, clean_proxy_env: pytest.MonkeyPatch
) -> None:
    async with open_client(kubeconfig) as kube:
        assert kube.api.rest_client.pool_manager.trust_env is False
        assert kube.api.configuration.proxy is None
        await kube.request("GET", "/api/v1/namespaces/default")


class ConnectProxy:
    """A minimal HTTP CONNECT proxy on loopback that counts the tunnels it opened."""

    def __init__(self) -> None:
        self.tunnels = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = request.split(b"\r\n", 1)[0].split(b" ", 2)
            if method != b"CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
                return
            host, _, port = target.decode().rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            self.tunnels += 1
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def test_a_proxy_in_the_environment_still_carries_the_requests(
    kubeconfig: Any, clean_proxy_env: pytest.MonkeyPatch
) -> None:
    proxy = ConnectProxy()
    url = await proxy.start()
    try:
        clean_proxy_env.setenv("HTTPS_PROXY", url)
        async with open_client(kubeconfig) as kube:
            assert kube.api.configuration.proxy == url
            answer = await kube.request("GET", "/api/v1/namespaces/default")
            assert answer["metadata"]["name"] == "default"
        assert proxy.tunnels >= 1
    finally:
        await proxy.stop()
