"""Item 12 of issue 9: in JSON mode every log line is one JSON object, tracebacks included,
whether it comes from structlog or from a library's stdlib logger (aiohttp, asyncio)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from hami import log


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    out = io.StringIO()
    log.configure("info", "json", stream=out)
    yield out
    log.configure("info", "console", stream=sys.__stderr__)
    logging.captureWarnings(False)


def _records(out: io.StringIO) -> list[dict[str, Any]]:
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    assert lines, "nothing was logged"
    records = []
    for line in lines:
        record = json.loads(line)  # a traceback line here would not parse
        assert isinstance(record, dict)
        records.append(record)
    return records


def _boom() -> None:
    raise RuntimeError("boom")


def test_structlog_exception_is_one_json_line(json_log: io.StringIO) -> None:
    try:
        _boom()
    except RuntimeError:
        log.get("hami.test").exception("handler failed", object="ns/p")
    (record,) = _records(json_log)
    assert record["event"] == "handler failed"
    assert record["object"] == "ns/p"
    assert "RuntimeError: boom" in record["exception"]


def test_stdlib_library_loggers_are_json_with_the_traceback_inside(
    json_log: io.StringIO,
) -> None:
    try:
        _boom()
    except RuntimeError:
        logging.getLogger("aiohttp.server").exception("Error handling request")
    logging.getLogger("kubernetes_asyncio.rest").warning("retrying %s", "GET /api")
    logging.getLogger("grpclib.server").error("stream reset")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("old option", DeprecationWarning, stacklevel=1)
    records = _records(json_log)
    assert len(records) == 4
    server = records[0]
    assert server["event"] == "Error handling request"
    assert server["logger"] == "aiohttp.server"
    assert server["level"] == "error"
    assert "RuntimeError: boom" in server["exception"]
    assert records[1]["event"] == "retrying GET /api"
    assert records[3]["logger"] == "py.warnings"


def test_asyncio_default_exception_handler_is_json(json_log: io.StringIO) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        try:
            _boom()
        except RuntimeError as exc:
            loop.call_exception_handler(
                {"message": "Task exception was never retrieved", "exception": exc}
            )

    asyncio.run(main())
    (record,) = _records(json_log)
    assert record["logger"] == "asyncio"
    assert "Task exception was never retrieved" in record["event"]
    assert "RuntimeError: boom" in record["exception"]


def test_console_mode_still_renders_structlog(json_log: io.StringIO) -> None:
    out = io.StringIO()
    log.configure("info", "console", stream=out)
    structlog.get_logger("x").info("hello", a=1)
    assert "hello" in out.getvalue()
