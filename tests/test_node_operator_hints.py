"""Log lines that tell an operator what to fix when the node agent is wired up wrong."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from _node_helpers import MemoryKube, fake_backend, running_agent, short_tmp_dir
from structlog.testing import capture_logs

from hami.kube.raw import KubeError, NotFound
from hami.node.registration import _hint


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (NotFound(404, "Not Found", 'nodes "ghost" not found', "/api/v1/nodes/ghost"), "NODE_NAME"),
        (KubeError(403, "Forbidden", "cannot patch", "/api/v1/nodes/n"), "RBAC"),
        (KubeError(0, "Unreachable", "refused", "/api/v1/nodes/n"), None),
    ],
)
def test_registration_failure_hints(error: KubeError, expected: str | None) -> None:
    hint = _hint(error)
    if expected is None:
        assert hint is None
    else:
        assert hint is not None and expected in hint


async def test_missing_kubelet_socket_is_said_once(tmp_path: Path) -> None:
    with short_tmp_dir() as short_dir, capture_logs() as logs:
        async with running_agent(short_dir, MemoryKube(), fake_backend(tmp_path)):
            async with asyncio.timeout(10):
                while not any(e["event"] == "waiting_for_kubelet" for e in logs):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            # kubelet.sock is polled every 50 ms here: ten more polls must stay quiet.
            await asyncio.sleep(0.5)
    waiting = [entry for entry in logs if entry["event"] == "waiting_for_kubelet"]
    assert len(waiting) == 1
    assert waiting[0]["socket"] == str(short_dir / "kubelet.sock")
    assert "device-plugins" in waiting[0]["hint"]
