"""Shared pytest configuration: fixtures for the real control plane live in hami.testkit.

Every test starts from the same logging state whatever ran before it: `hami demo`, the
role entry points and `log.configure` change structlog's global configuration (a level
filter there hides the lines `structlog.testing.capture_logs` looks for), bind context
variables and replace the stdlib root handlers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

pytest_plugins: list[str] = ["hami.testkit.pytest_plugin"]


@pytest.fixture(autouse=True)
def fresh_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = handlers
    root.setLevel(level)
