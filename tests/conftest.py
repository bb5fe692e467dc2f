"""Shared pytest configuration: fixtures for the real control plane live in hami.testkit.

Every test starts from the same logging state whatever ran before it: `hami demo`, the
role entry points and `log.configure` change structlog's global configuration (a level
filter there hides the lines `structlog.testing.capture_logs` looks for), bind context
variables and replace the stdlib root handlers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
import structlog

pytest_plugins: list[str] = ["hami.testkit.pytest_plugin"]


def _below_warning_dropped(_logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
    if method in ("debug", "info"):
        raise structlog.DropEvent
    return event


def _test_logging() -> None:
    """Every level reaches the processors, so `capture_logs` (which replaces them) sees
    info and debug lines; without it only warnings and errors are printed."""
    structlog.reset_defaults()
    structlog.configure(
        processors=[
            _below_warning_dropped,
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ]
    )
    structlog.contextvars.clear_contextvars()


@pytest.fixture(autouse=True)
def fresh_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    _test_logging()
    yield
    _test_logging()
    root.handlers[:] = handlers
    root.setLevel(level)
