"""Structured logging: JSON in a cluster (no terminal), readable console output otherwise."""

from __future__ import annotations

import logging
import sys
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


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Set up structlog (and stdlib logging, for libraries) once per process."""
    out: Any = stream or _CurrentStderr()
    as_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    numeric = _LEVELS.get(level.lower(), logging.INFO)
    renderer: Any = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info if as_json else structlog.dev.set_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # Libraries (aiohttp, kubernetes_asyncio) log through stdlib: keep them quieter.
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=out, force=True)


def bind(**context: Any) -> None:
    """Bind context (role, node, backend) for every later log line of this task."""
    structlog.contextvars.bind_contextvars(**context)


def get(name: str) -> Any:
    return structlog.get_logger(name)
