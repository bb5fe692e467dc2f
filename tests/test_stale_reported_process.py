"""A stale ``Reported`` never drops a live node (issue 18 item 5), with real processes: a
``hami run --role scheduler`` process on the real control plane, and Nodes annotated as a
Go HAMi plugin upgraded from <= 2.7 (which wrote ``Reported_``) to >= 2.8 (which never
does) leaves them, kubelet's allocatable set through the status subresource.

- ``stale``: one ``Reported`` stamp an hour old. It stays available period after period
  while kubelet advertises ``nvidia.com/gpu`` (before: "handshake timed out" one timeout
  after the scheduler started, until it restarted), goes unavailable when allocatable
  drops to 0 and comes back when it returns.
- ``fresh``: a last ``Reported`` written just now, then silence. An agent that heartbeats
  keeps the §2 table (dropped once the scheduler's stamp expires), and it comes back as
  soon as that Reported is two timeouts old (before: out for good).

Short timings (1 s pass, 4 s timeout); the clock is the real one of both processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from _sched_helpers import create_node, create_pod, delete_nodes, gpu_pod, unique
from test_interop_go_plugin_node import go_plugin_register, set_status

from hami.kube.client import Kube
from hami.kube.raw import MERGE_PATCH
from hami.protocol import handshake, keys
from hami.testkit.controlplane import ControlPlane, free_port

PERIOD = 1.0  # seconds: handshake_period
TIMEOUT = 4.0  # seconds: handshake_timeout; a Reported counts for 2 of them
ON = "fits"  # explain's word for a node that takes the pod
TIMED_OUT = handshake.HANDSHAKE_TIMED_OUT
KUBELET_NO = "kubelet reports 0 allocatable nvidia.com/gpu"


@contextlib.asynccontextmanager
async def scheduler_process(plane: ControlPlane, workdir: Path) -> AsyncIterator[str]:
    """``hami run --role scheduler``; yields its extender URL once it is ready."""
    extender, probes = free_port(), free_port()
    cfg = {
        "log": {"format": "json", "level": "info"},
        "kubeconfig": str(plane.kubeconfig),
        "scheduler": {
            "http": {"address": "127.0.0.1", "port": probes},
            "extender": {"address": "127.0.0.1", "port": extender},
            "handshake_period": f"{PERIOD}s",
            "handshake_timeout": f"{TIMEOUT}s",
            "webhook": {"enabled": False},
        },
        "backends": {"nvidia": {"enabled": True}},
    }
    path = workdir / "scheduler.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log_path = workdir / "scheduler.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "hami", "run", "--role", "scheduler", "--config", str(path)),
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            await _until_ready(f"http://127.0.0.1:{probes}/readyz", proc)
            yield f"http://127.0.0.1:{extender}"
        except BaseException:
            sys.stderr.write(log_path.read_text(errors="replace")[-4000:])
            raise
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


async def _until_ready(url: str, proc: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            assert proc.returncode is None, "the scheduler process exited"
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise AssertionError("the scheduler process did not turn ready in 60 s")


async def reasons(url: str, namespace: str, pod: str, nodes: list[str]) -> dict[str, str]:
    """The scheduler's /explain: each node's reason for not taking the pod, or "fits"."""
    query = {"namespace": namespace, "name": pod}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/explain", params=query) as resp,
    ):
        answer: dict[str, Any] = await resp.json()
    found: dict[str, str] = answer.get("nodes") or {}
    assert all(n in found for n in nodes), answer
    return {n: found[n] for n in nodes}


async def until(url: str, namespace: str, pod: str, node: str, want: str, within: float) -> None:
    deadline = time.monotonic() + within
    seen = ""
    while time.monotonic() < deadline:
        seen = (await reasons(url, namespace, pod, [node]))[node]
        if want in seen:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{node}: expected {want!r} within {within}s, last {seen!r}")


async def test_a_stale_reported_never_drops_a_node_that_kubelet_advertises(
    kube: Kube, controlplane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    stale, fresh = unique("stale-reported"), unique("fresh-reported")
    old = handshake.reported(datetime(2024, 5, 20, 9, 0, 0, tzinfo=UTC))
    for name in (stale, fresh):
        await create_node(
            kube,
            name,
            {keys.node_register("nvidia"): go_plugin_register(name), keys.NVIDIA_HANDSHAKE: old},
        )
    try:
        for name in (stale, fresh):
            await set_status(kube, name, "20", "20")
        pod = gpu_pod("p", mem=3000)
        pod["spec"]["schedulerName"] = unique("nobody")  # judged by explain, never bound
        await create_pod(kube, namespace, pod)
        async with scheduler_process(controlplane, tmp_path) as url:
            # The <= 2.7 plugin's last heartbeat, just before its upgrade: seen as one.
            last = time.monotonic()
            await kube.request(
                "PATCH",
                f"/api/v1/nodes/{fresh}",
                body={
                    "metadata": {
                        "annotations": {
                            keys.NVIDIA_HANDSHAKE: handshake.reported(datetime.now(UTC))
                        }
                    }
                },
                content_type=MERGE_PATCH,
            )
            history: list[dict[str, str]] = []
            # Well past both windows (before: stale was out after about TIMEOUT + PERIOD).
            while time.monotonic() - last < 2 * TIMEOUT + 4 * PERIOD:
                history.append(await reasons(url, namespace, "p", [stale, fresh]))
                await asyncio.sleep(0.2)
            dropped = [(i, h[stale]) for i, h in enumerate(history) if h[stale] != ON]
            assert not dropped, f"{len(history)} samples, stale dropped at {dropped[:3]}"
            # fresh heartbeated: the table dropped it when the scheduler's stamp expired...
            assert any(TIMED_OUT in h[fresh] for h in history), [h[fresh] for h in history]
            # ...and it is back now that its Reported is older than two timeouts
            await until(url, namespace, "p", fresh, ON, 2 * PERIOD)
            for _ in range(int(2 * TIMEOUT / 0.2)):
                assert await reasons(url, namespace, "p", [stale, fresh]) == {
                    stale: ON,
                    fresh: ON,
                }
                await asyncio.sleep(0.2)

            # kubelet's "no" (the plugin's socket is gone) turns it off, its "yes" back on
            await set_status(kube, stale, "0", "20")
            await until(url, namespace, "p", stale, KUBELET_NO, 5)
            await set_status(kube, stale, None, None)  # dropped: expired stamps, no resource
            await until(url, namespace, "p", stale, TIMED_OUT, 5)
            await set_status(kube, stale, "20", "20")
            await until(url, namespace, "p", stale, ON, 5)
    finally:
        await delete_nodes(kube, [stale, fresh])
