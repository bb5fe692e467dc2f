"""The extender's JSON codec (orjson): the answer shape kube-scheduler reads, and what the
json module allowed that orjson would refuse (non-str keys, NaN) never breaks an answer."""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from hami.scheduler import http


def test_filter_answer_keeps_kube_schedulers_field_names() -> None:
    answer = {"NodeNames": ["n1"], "FailedNodes": {"n2": "no GPU fits"}, "Error": ""}
    raw = http.encode(answer)
    assert json.loads(raw) == answer
    assert raw.startswith(b'{"NodeNames":["n1"],"FailedNodes":{"n2":')


def test_non_str_keys_and_nan_still_encode_as_valid_json() -> None:
    raw = http.encode({"FailedNodes": {1: "x"}, "score": math.nan, "inf": math.inf})
    # strict JSON (no NaN literal), keys written as strings the way the json module does
    assert json.loads(raw, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))) == {
        "FailedNodes": {"1": "x"},
        "score": None,
        "inf": None,
    }


def test_unencodable_answer_becomes_an_error_answer() -> None:
    raw = http.encode({"NodeNames": [2**70]})
    assert "could not encode" in json.loads(raw)["Error"]


async def _decode(body: bytes) -> tuple[Any, str | None]:
    seen: list[tuple[Any, str | None]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(await http._json_body(request, 4096))
        return web.Response()

    app = web.Application()
    app.router.add_post("/", handler)
    async with TestClient(TestServer(app)) as client:
        await client.post("/", data=body)
    return seen[0]


async def test_bodies_decode_and_bad_ones_are_errors_not_crashes() -> None:
    assert await _decode(b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a"]}') == (
        {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a"]},
        None,
    )
    for bad in (b"{", b"\xff\xfe", b"[" * 1100 + b"]" * 1100, b'{"a": NaN}'):
        body, error = await _decode(bad)
        assert body is None and error is not None and error.startswith("request body is not JSON")
    body, error = await _decode(b"x" * 5000)
    assert body is None and error == "request body larger than 4096 bytes"
