"""The one retry policy of hami.kube.client.Kube, against a real HTTP server that misbehaves
on cue.

The API server does not answer 429 or 503 on demand, so these use a small aiohttp server
on loopback; paging is also checked against the real kube-apiserver (test_kube_io.py).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from hami.kube.client import Kube
from hami.kube.raw import (
    NO_RETRY,
    Gone,
    KubeError,
    RetryPolicy,
    Unreachable,
    should_retry,
    with_retry,
)

FAST = RetryPolicy(retries=3, base=0.001, cap=0.002, max_retry_after=0.05)

Script = list[tuple[int, dict[str, str]]]


class Server:
    """Answers each request with the next (status, headers) of its script, then 200."""

    def __init__(self) -> None:
        self.script: Script = []
        self.seen: list[tuple[str, str]] = []
        self.pages: dict[str, Any] = {}

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path_qs))
        if self.script:
            status, headers = self.script.pop(0)
            return web.json_response(
                {"message": f"scripted {status}"}, status=status, headers=headers
            )
        token = request.query.get("continue", "")
        if request.path == "/api/v1/configmaps":
            page = self.pages[token]
            if isinstance(page, int):  # e.g. 410: the continue token expired
                return web.json_response({"message": "continue token expired"}, status=page)
            return web.json_response(page)
        return web.json_response({"ok": True, "method": request.method})


@pytest.fixture
async def server() -> AsyncIterator[tuple[Server, Kube]]:
    state = Server()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    async with client.ApiClient(configuration) as api:
        yield state, Kube(api, FAST)
    await runner.cleanup()


async def test_429_is_retried_and_retry_after_read(server: tuple[Server, Any]) -> None:
    state, kube = server
    state.script = [(429, {"Retry-After": "0"}), (429, {"Retry-After": "0"})]
    assert (await kube.request("GET", "/api/v1/nodes"))["ok"] is True
    assert len(state.seen) == 3

    state.seen.clear()
    state.script = [(429, {"Retry-After": "7"})]
    with pytest.raises(KubeError) as caught:
        await kube.with_retry(NO_RETRY).request("POST", "/api/v1/namespaces/x/events", body={})
    assert caught.value.status == 429
    assert caught.value.retry_after == 7.0
    assert len(state.seen) == 1


async def test_5xx_retries_idempotent_methods_only(server: tuple[Server, Any]) -> None:
    state, kube = server
    state.script = [(503, {}), (500, {})]
    patched = await kube.request("PATCH", "/api/v1/nodes/a", body={})
    assert patched["method"] == "PATCH"
    assert len(state.seen) == 3

    # A POST that reached the server may have been applied (a Binding): never repeated.
    state.seen.clear()
    state.script = [(503, {})]
    with pytest.raises(KubeError) as caught:
        await kube.request("POST", "/api/v1/namespaces/x/pods/p/binding", body={})
    assert caught.value.status == 503
    assert len(state.seen) == 1


async def test_client_errors_are_not_retried(server: tuple[Server, Any]) -> None:
    state, kube = server
    state.script = [(404, {})]
    with pytest.raises(KubeError) as caught:
        await kube.request("GET", "/api/v1/nodes/none")
    assert caught.value.status == 404
    assert len(state.seen) == 1


async def test_retries_stop_after_the_policy(server: tuple[Server, Any]) -> None:
    state, kube = server
    state.script = [(503, {})] * 10
    with pytest.raises(KubeError) as caught:
        await kube.request("GET", "/api/v1/nodes")
    assert caught.value.status == 503
    assert len(state.seen) == FAST.retries + 1


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_refused_connection_is_retried_even_for_post() -> None:
    configuration = client.Configuration(host=f"http://127.0.0.1:{_closed_port()}")
    calls: list[float] = []

    async def sleep(seconds: float) -> None:
        calls.append(seconds)

    async with client.ApiClient(configuration) as api:
        with pytest.raises(Unreachable) as caught:
            await with_retry(
                "POST",
                lambda: Kube(api, NO_RETRY).request("POST", "/api/v1/namespaces/x/events"),
                RetryPolicy(retries=2, base=0.001),
                sleep,
            )
    assert caught.value.sent is False
    assert len(calls) == 2  # refused: it never reached a server, so a POST is safe to repeat


def test_should_retry_table() -> None:
    def err(status: int) -> KubeError:
        return KubeError(status, "x", "y", "/p")

    sent = Unreachable("reset", "/p", sent=True)
    assert should_retry("POST", err(429))
    assert should_retry("GET", err(503)) and should_retry("PATCH", err(504))
    assert not should_retry("POST", err(503))
    assert not should_retry("GET", err(409)) and not should_retry("GET", err(422))
    assert should_retry("GET", sent) and not should_retry("POST", sent)


async def test_back_off_grows_is_capped_and_jittered() -> None:
    policy = RetryPolicy(retries=8, base=0.1, cap=1.0, max_retry_after=5.0)
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    async def always_503() -> None:
        raise KubeError(503, "Unavailable", "", "/p")

    with pytest.raises(KubeError):
        await with_retry("GET", always_503, policy, sleep)
    assert len(delays) == 8
    for attempt, delay in enumerate(delays):
        assert 0 <= delay <= min(policy.cap, policy.base * 2**attempt)
    assert len(set(delays)) > 1  # jittered, not a fixed schedule

    throttled = KubeError(429, "TooManyRequests", "", "/p")
    throttled.retry_after = 3.0
    assert policy.delay(0, throttled.retry_after) >= 3.0
    assert policy.delay(0, 3600.0) == policy.max_retry_after  # a silly header is capped


async def test_list_all_follows_continue_tokens(server: tuple[Server, Any]) -> None:
    state, kube = server
    state.pages = {
        "": {"metadata": {"continue": "t1", "resourceVersion": "10"}, "items": [{"n": 1}]},
        "t1": {"metadata": {"continue": "t2", "resourceVersion": "10"}, "items": [{"n": 2}]},
        "t2": {"metadata": {"resourceVersion": "10"}, "items": [{"n": 3}]},
    }
    items, version = await kube.list_all("/api/v1/configmaps", page_size=1)
    assert [i["n"] for i in items] == [1, 2, 3]
    assert version == "10"
    assert all("limit=1" in path for _m, path in state.seen)


async def test_an_expired_continue_token_raises_gone(server: tuple[Server, Any]) -> None:
    """The caller (a reflector) lists again from the start: items of a half-read list are
    not returned as if they were the whole."""
    state, kube = server
    state.pages = {
        "": {"metadata": {"continue": "t1", "resourceVersion": "10"}, "items": [{"n": 1}]},
        "t1": 410,
    }
    with pytest.raises(Gone):
        await kube.list_all("/api/v1/configmaps", page_size=1)
    assert len(state.seen) == 2  # 410 is not retried


async def test_with_retry_keeps_the_session_and_changes_the_policy(
    server: tuple[Server, Any],
) -> None:
    state, kube = server
    patient = kube.with_retry(RetryPolicy(retries=6, base=0.001, cap=0.002))
    assert patient.api is kube.api and patient.retry.retries == 6
    state.script = [(503, {})] * 5  # more than FAST's 3 retries, fewer than 6
    assert (await patient.request("GET", "/api/v1/nodes"))["ok"] is True
    state.script = [(503, {})] * 5
    with pytest.raises(KubeError):
        await kube.request("GET", "/api/v1/nodes")


async def test_time_budget_ends_retries_before_the_count_does() -> None:
    clock = [0.0]

    async def sleep(seconds: float) -> None:
        clock[0] += seconds

    tries = [0]

    async def always_503() -> None:
        tries[0] += 1
        raise KubeError(503, "Unavailable", "", "/p")

    policy = RetryPolicy(retries=1_000, base=1.0, cap=1.0, budget=10.0)
    with pytest.raises(KubeError):
        await with_retry("GET", always_503, policy, sleep, now=lambda: clock[0])
    # Each wait is at most 1 s, so the budget allows at least 10 tries and never a wait
    # that would end past it.
    assert 10 <= tries[0] < 1_000
    assert clock[0] <= policy.budget
