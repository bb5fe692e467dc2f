"""A scheduler "pod" as processes: ``hami run --role scheduler`` with leader election and
the kube-scheduler that uses it as its extender (with kube-scheduler's own election), and
small polling predicates; shared by the failover and split-brain tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from hami.config import LeaderElectionConfig
from hami.kube.client import Kube
from hami.kube.raw import NotFound
from hami.scheduler.leader import LEASES
from hami.testkit.cluster import SCHEDULER_NAME, LocalCluster
from hami.testkit.controlplane import ControlPlane, SchedulerProcess, free_port

ELECTION = LeaderElectionConfig()  # the defaults, which the chart gives both leases


def _go_duration(seconds: float) -> str:
    return f"{seconds:g}s"


class Replica:
    """One scheduler pod: the hami process and its kube-scheduler."""

    def __init__(self, identity: str, workdir: Path) -> None:
        self.identity = identity
        self.workdir = workdir
        self.probe_port = free_port()
        self.extender_port = free_port()
        self.proc: asyncio.subprocess.Process | None = None
        self.kube_scheduler: SchedulerProcess | None = None

    @property
    def probes(self) -> str:
        return f"http://127.0.0.1:{self.probe_port}"

    async def start_hami(self, plane: ControlPlane, cluster: LocalCluster, lease: str) -> None:
        t = cluster.timing
        cfg = {
            "log": {"format": "json", "level": "info"},
            "kubeconfig": str(plane.kubeconfig),
            "scheduler": {
                "scheduler_name": SCHEDULER_NAME,
                "http": {"address": "127.0.0.1", "port": self.probe_port},
                "extender": {"address": "127.0.0.1", "port": self.extender_port},
                "handshake_period": f"{t.handshake_period}s",
                "handshake_timeout": f"{t.handshake_timeout}s",
                "bind_lock_wait": f"{t.bind_lock_wait}s",
                "webhook": {"enabled": False},
                "leader_election": {
                    "enabled": True,
                    "lease_name": lease,
                    "namespace": cluster.namespace,
                    "identity": self.identity,
                },  # default timing: 8 s lease, 5 s renew deadline, 1 s retry
            },
            "backends": {"nvidia": {"enabled": False}, "fake": {"enabled": True}},
        }
        path = self.workdir / f"{self.identity}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.log = (self.workdir / f"{self.identity}.log").open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "hami", "run", "--role", "scheduler", "--config", str(path)),
            stdout=self.log,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    async def start_kube_scheduler(
        self, plane: ControlPlane, base: dict[str, Any], namespace: str, lease: str
    ) -> None:
        cfg = dict(base)
        cfg["extenders"] = [
            {**base["extenders"][0], "urlPrefix": f"http://127.0.0.1:{self.extender_port}"}
        ]
        cfg["leaderElection"] = {
            "leaderElect": True,
            "resourceName": lease,
            "resourceNamespace": namespace,
            "leaseDuration": _go_duration(ELECTION.lease_duration.seconds),
            "renewDeadline": _go_duration(ELECTION.renew_deadline.seconds),
            "retryPeriod": _go_duration(ELECTION.retry_period.seconds),
        }
        sched = plane.start_scheduler(cfg, f"ks-{self.identity}-{lease}", wait=False)
        self.kube_scheduler = sched
        await asyncio.to_thread(sched.wait_ready, 60)

    async def readyz(self) -> str:
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"{self.probes}/readyz") as resp,
            ):
                return await resp.text() if resp.status == 200 else ""
        except aiohttp.ClientError:
            return ""

    async def metric(self, line: str) -> float | None:
        """The value of the series that starts with ``line`` (None if not found)."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.probes}/metrics") as resp,
        ):
            text = await resp.text()
        match = re.search(rf"^{re.escape(line)} (\S+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else None

    async def kill(self) -> None:
        """The pod dies: both containers get SIGKILL."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        if self.kube_scheduler is not None and self.kube_scheduler.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.kube_scheduler.process.pid, signal.SIGKILL)

    async def stop(self, plane: ControlPlane) -> None:
        await self.kill()
        if self.kube_scheduler is not None:
            await asyncio.to_thread(self.kube_scheduler.stop)
            with contextlib.suppress(ValueError):
                plane.schedulers.remove(self.kube_scheduler)
        if self.proc is not None:
            self.log.close()

    async def pause(self) -> None:
        """The pod freezes (both containers SIGSTOP): a stalled VM, a CPU-starved node."""
        self._signal(signal.SIGSTOP)

    async def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)
        if self.kube_scheduler is not None and self.kube_scheduler.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.kube_scheduler.process.pid, sig)


async def _holder(kube: Kube, namespace: str, name: str) -> str:
    try:
        lease = await kube.request("GET", LEASES.format(namespace=namespace) + "/" + name)
    except NotFound:
        return ""
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def _is(text: Any, want: str) -> bool:
    return bool(await text == want)


async def _truthy(value: Any) -> bool:
    return bool(await value)


async def _is_value(value: Any, want: float) -> bool:
    try:
        return bool(await value == want)
    except aiohttp.ClientError:
        return False


async def _above(value: Any, floor: float) -> bool:
    return bool((await value or 0) > floor)


async def hand_over_to_processes(
    cluster: LocalCluster, controlplane: ControlPlane
) -> dict[str, Any]:
    """The cluster's own in-process scheduler role and kube-scheduler give way to replicas
    run as processes (as a two-replica Deployment runs them); returns kube-scheduler's
    config for them to start from."""
    base = cluster.kube_scheduler_config()
    own = cluster.kube_scheduler
    cluster.kube_scheduler = None
    assert own is not None
    await asyncio.to_thread(own.stop)
    controlplane.schedulers.remove(own)
    await cluster.stop_role()
    return base
