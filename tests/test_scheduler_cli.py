"""`hami run --role scheduler` as a process, `hami explain`, and HTTP edge cases."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from _core_helpers import NVIDIA
from _sched_helpers import (
    FakeClock,
    create_node,
    create_pod,
    delete_nodes,
    gpu_pod,
    register,
    running_scheduler,
    unique,
)
from aiohttp import web

from hami import cli, config, log
from hami.kube.client import Kube
from hami.scheduler import http as sched_http
from hami.scheduler.service import Scheduler
from hami.testkit.cluster import poll

REPORTED = "Reported_2024-05-20 09:59:50"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_scheduler_process_serves_and_stops_on_sigterm(
    kubeconfig: Path, tmp_path: Path
) -> None:
    port = free_port()
    cfg_file = tmp_path / "hami.yaml"
    cfg_file.write_text(
        yaml.safe_dump(
            {
                "log": {"format": "json"},
                "kubeconfig": str(kubeconfig),
                "scheduler": {
                    "http": {"address": "127.0.0.1", "port": port},
                    "extender": {"address": "127.0.0.1", "port": 0},
                    "webhook": {"enabled": False},
                },
                "backends": {"nvidia": {"enabled": True}, "mlu": {"enabled": True}},
            }
        )
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hami",
        "run",
        "--role",
        "scheduler",
        "--config",
        str(cfg_file),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await poll(ready, 60)
            async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
            assert "hami_filter_duration_seconds" in text
            # Alerted-on series exist at 0 before their first event.
            assert 'hami_bind_total{outcome="failed",reason="node_locked"} 0.0' in text
            assert 'hami_filter_total{outcome="error"} 0.0' in text
            assert 'hami_annotation_errors_total{object="node"} 0.0' in text
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stdout is not None
    lines = [
        json.loads(line)
        for line in (await proc.stdout.read()).decode().splitlines()
        if line.startswith("{")
    ]
    events = [line.get("event") for line in lines]
    assert "scheduler role started" in events
    started = next(line for line in lines if line.get("event") == "scheduler role started")
    assert started["types"] == ["nvidia", "mlu"]


async def test_explain_from_scheduler_and_offline(
    kube: Kube,
    namespace: str,
    kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # cli.main would point logging at capsys' stream, which closes after this test.
    monkeypatch.setattr(log, "configure", lambda *args, **kwargs: None)
    names = [unique("ex-a"), unique("ex-b")]
    await create_node(
        kube,
        names[0],
        {
            "hami.io/node-nvidia-register": register([f"GPU-{names[0]}"], memory=4000),
            "hami.io/node-handshake-nvidia": REPORTED,
        },
    )
    await create_node(
        kube,
        names[1],
        {
            "hami.io/node-nvidia-register": register([f"GPU-{names[1]}"], memory=40000),
            "hami.io/node-handshake-nvidia": REPORTED,
        },
    )
    try:
        await create_pod(kube, namespace, gpu_pod("p", mem=8000))
        async with running_scheduler(kube, FakeClock()) as role:
            await poll(lambda: all(n in role.scheduler.cluster.nodes for n in names))
            code = await asyncio.to_thread(
                cli.main, ["explain", "p", "-n", namespace, "--url", role.url, "--json"]
            )
            out = capsys.readouterr().out
        # the role logs to stdout (structlog's default) before the CLI configures logging
        online = json.loads(out[out.index("{\n") :])
        assert code == 0
        assert online["nodes"][names[0]] == "1/1 CardInsufficientMemory"
        assert online["nodes"][names[1]] == "fits"
        code = await asyncio.to_thread(
            cli.main,
            ["explain", "p", "-n", namespace, "--offline", "--kubeconfig", str(kubeconfig)],
        )
        out = capsys.readouterr().out
        assert code == 0
        assert f"pod {namespace}/p" in out
        row = next(line for line in out.splitlines() if line.startswith(names[0]))
        assert row.split(None, 1)[1] == "1/1 CardInsufficientMemory"
        row = next(line for line in out.splitlines() if line.startswith(names[1]))
        assert row.split(None, 1)[1] == "fits"
    finally:
        await delete_nodes(kube, names)


async def test_http_edge_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config.from_mapping({}, env={})
    scheduler = Scheduler(cfg.scheduler, [NVIDIA], None, emit_events=False)
    monkeypatch.setattr(sched_http, "MAX_BODY", 1024)
    runner = web.AppRunner(sched_http.build_app(scheduler, "hami-scheduler"))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as s:
            # not synced yet: not ready, and filter refuses to decide
            async with s.get(f"{url}/readyz") as r:
                assert r.status == 503
            async with s.post(f"{url}/filter", json={"Pod": {}, "NodeNames": ["a"]}) as r:
                assert r.status == 200
                assert "not synced" in (await r.json())["Error"]
            scheduler.nodes_synced.set()
            scheduler.pods_synced.set()
            async with s.post(f"{url}/filter", data=b"{nope") as r:
                assert r.status == 200
                assert "not JSON" in (await r.json())["Error"]
            async with s.post(f"{url}/filter", data=b"[" + b" " * 4096 + b"]") as r:
                assert r.status == 200
                assert "larger than" in (await r.json())["Error"]
            async with s.post(f"{url}/filter", json=[1, 2]) as r:
                assert (await r.json())["Error"] == "hami filter: no Pod"
            async with s.post(f"{url}/filter", json={"POD": gpu_pod("x"), "NODENAMES": ["a"]}) as r:
                answer = await r.json()
            assert answer == {
                "NodeNames": [],
                "FailedNodes": {"a": "node unregistered"},
                "Error": "",
            }
            # nodeCacheCapable false: full Nodes in, full Nodes out
            plain = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c"}]}}
            nodes = {
                "apiVersion": "v1",
                "kind": "NodeList",
                "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}],
            }
            async with s.post(f"{url}/filter", json={"Pod": plain, "Nodes": nodes}) as r:
                answer = await r.json()
            assert answer["NodeNames"] == ["a", "b"]
            assert answer["Nodes"] == nodes
            async with s.post(f"{url}/bind", json={"PodName": ""}) as r:
                assert r.status == 200
                assert "required" in (await r.json())["Error"]
    finally:
        await runner.cleanup()
