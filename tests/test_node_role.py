"""``hami run --role node`` as a process: node name required, registration, clean SIGTERM."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _node_helpers import spawn_node_agent, write_fake_node_config

from hami import cli, log
from hami.kube.client import Kube
from hami.testkit import ControlPlane


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> None:
    """Another test's cli.main may have pointed logging at a capture stream closed since."""
    log.configure("info", "console", stream=sys.__stderr__)


def test_node_role_without_node_name_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    # cli.main configures logging onto capsys' stream, which closes after this test.
    monkeypatch.setattr(log, "configure", lambda *args, **kwargs: None)
    assert cli.main(["run", "--role", "node"]) == 2
    err = capsys.readouterr().err
    assert "NODE_NAME" in err and "--node-name" in err


@pytest.fixture
def work_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hn-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_node_role_process_registers_and_stops_on_sigterm(
    controlplane: ControlPlane, kubelet_factory: Any, kube: Kube, work_dir: Path
) -> None:
    node = f"n-proc-{uuid.uuid4().hex[:6]}"
    kubelet = await kubelet_factory(node)
    path = write_fake_node_config(node, kubelet.plugin_dir, work_dir, level="info")
    proc = await spawn_node_agent(path, controlplane.kubeconfig, node)
    try:
        await kubelet.wait_for_resource("nvidia.com/gpu", healthy=2, timeout=30)

        async def registered() -> bool:
            obj = await kube.get_node(node)
            annotations = obj["metadata"].get("annotations") or {}
            return bool(
                annotations.get("hami.io/node-nvidia-register")
                == f"GPU-{node}-0,2,40960,100,NVIDIA-A100,0,true:"
            )

        async with asyncio.timeout(20):
            while not await registered():  # noqa: ASYNC110 - polls the API server
                await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            code = await proc.wait()
        assert code == 0
        assert not (kubelet.plugin_dir / "hami-nvidia.sock").exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        assert proc.stdout is not None
        output = (await proc.stdout.read()).decode()
    assert '"role": "node"' in output and "stopped" in output
