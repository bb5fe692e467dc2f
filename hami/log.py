"""Structured logging: JSON in a cluster (no terminal), readable console output otherwise.

Every line is one JSON object in JSON mode, whoever logs it: structlog loggers render
directly, and the stdlib loggers of libraries (aiohttp, asyncio, kubernetes_asyncio,
grpclib, warnings) go through the same renderer via ``structlog.stdlib.ProcessorFormatter``,
with any traceback inside the object (``exception``), never as extra lines.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType
from typing import Any, TextIO

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is now, not what it was at configure time
    (pytest and daemons swap it; a captured stream may be closed later)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def _renderer(as_json: bool) -> Any:
    if as_json:
        return structlog.processors.JSONRenderer()
    return structlog.dev.ConsoleRenderer()


def _common(as_json: bool) -> list[Any]:
    """Processors shared by structlog and stdlib records, before rendering."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        # JSON: the traceback becomes the "exception" string field (one line once encoded).
        structlog.processors.format_exc_info if as_json else structlog.dev.set_exc_info,
    ]


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Set up structlog and stdlib logging (for libraries) once per process."""
    out: Any = stream or _CurrentStderr()
    as_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    numeric = _LEVELS.get(level.lower(), logging.INFO)
    structlog.configure(
        processors=[*_common(as_json), _renderer(as_json)],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    _configure_stdlib(out, as_json, numeric)
    if as_json and stream is None:
        _route_uncaught()


def _configure_stdlib(out: Any, as_json: bool, numeric: int) -> None:
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_logger_name,
            *_common(as_json),
        ],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, _renderer(as_json)],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    # Libraries (aiohttp, kubernetes_asyncio) are chatty: warnings and up only.
    root.setLevel(max(numeric, logging.WARNING))
    logging.captureWarnings(True)  # warnings.warn output becomes a record too


def _route_uncaught() -> None:
    """Uncaught exceptions (main thread, other threads) as one JSON record, not a traceback."""
    crash = logging.getLogger("hami.uncaught")

    def excepthook(
        kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        crash.critical("uncaught exception", exc_info=(kind, value, tb))

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None:
            return
        crash.error(
            "uncaught exception in thread %s",
            args.thread.name if args.thread else "?",
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = excepthook
    threading.excepthook = thread_hook


def bind(**context: Any) -> None:
    """Bind context (role, node, backend) for every later log line of this task."""
    structlog.contextvars.bind_contextvars(**context)


def get(name: str) -> Any:
    return structlog.get_logger(name)
