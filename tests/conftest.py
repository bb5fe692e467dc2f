"""Shared pytest configuration: fixtures for the real control plane live in hami.testkit.

Every test starts from the same logging state whatever ran before it: `hami demo`, the
role entry points and `log.configure` change structlog's global configuration (a level
filter there hides the lines `structlog.testing.capture_logs` looks for), bind context
variables and replace the stdlib root handlers.

A run whose tests all pass still fails when Nodes or DeviceClasses are left on the shared
control plane at the end (see the leak guard below): later tests would see them.
"""

from __future__ import annotations

import json
import logging
import ssl
import urllib.request
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


# --------------------------------------------------------------------------- leak guard
# Tests share one control plane, so a Node or DeviceClass a test leaves behind changes
# what later tests see (an extra node in the scheduler's `/explain`, a DeviceClass that
# maps `nvidia.com/gpu` to DRA). The plugin itself keeps none of these, so any left at
# the end of the session is a leak: named in the summary with the test file after which
# it first appeared, and the run fails.

_LEAK_KINDS = {
    "Node": "/api/v1/nodes",
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
}
_leak_state: dict[str, Any] = {"plane": None, "seen": {}, "origin": {}, "left": {}}


def _cluster_names(plane: Any) -> dict[str, set[str]]:
    """Names of the guarded kinds, through the admin certificate (sync: runs in hooks)."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_path))
    ctx.load_cert_chain(str(plane.admin_cert_path), str(plane.admin_key_path))
    names: dict[str, set[str]] = {}
    for kind, path in _LEAK_KINDS.items():
        with urllib.request.urlopen(plane.server + path, context=ctx, timeout=10) as resp:
            names[kind] = {item["metadata"]["name"] for item in json.load(resp)["items"]}
    return names


def _note_new(where: str) -> None:
    plane = _leak_state["plane"]
    try:
        now = _cluster_names(plane)
    except (OSError, ValueError, KeyError):
        return  # the plane is going away: nothing to attribute
    for kind, names in now.items():
        for name in names - _leak_state["seen"].get(kind, set()):
            _leak_state["origin"][(kind, name)] = where
    _leak_state["seen"] = now


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


class _LeakGuard:
    """Registered as a global plugin: a conftest's own hooks are scoped to its directory,
    and the session-scoped `controlplane` is set up for the session, not for tests/."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: pytest.FixtureRequest) -> Any:
        result = yield
        if fixturedef.argname == "controlplane" and _leak_state["plane"] is None:
            _leak_state["plane"] = result
            _leak_state["seen"] = _cluster_names(result)
            fixturedef.addfinalizer(self._at_end)  # runs before the plane stops (LIFO)
        return result

    @staticmethod
    def _at_end() -> None:
        _note_new("the last test file that used the control plane")
        _leak_state["left"] = {
            key: where
            for key, where in _leak_state["origin"].items()
            if key[1] in _leak_state["seen"].get(key[0], set())
        }

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        result = yield
        # at each test file's end (its module fixtures are gone by now): a few cheap GETs
        if (
            _leak_state["plane"] is not None
            and nextitem is not None
            and _module_of(nextitem) != _module_of(item)
        ):
            _note_new(_module_of(item))
        return result

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if _leak_state["left"] and exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        left: dict[tuple[str, str], str] = _leak_state["left"]
        if not left:
            return
        terminalreporter.section("cluster-scoped objects left on the shared control plane")
        for (kind, name), where in sorted(left.items()):
            terminalreporter.write_line(
                f"{kind} {name}: appeared during {where}; delete it there", red=True
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_LeakGuard(), "hami-tests-leak-guard")
