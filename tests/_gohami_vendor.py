"""Go HAMi's scheduler over a node of another vendor served by this project's node agent
(tests/test_interop_go_cambricon.py, tests/test_interop_go_ascend.py; docs/interop.md).

    async with GoScheduler(binary, plane, DEVICE_CONFIG, ["--enable-ascend"]) as go:
        await kube_scheduler(go.kube_scheduler_config(RESOURCES))

Runs Go HAMi's scheduler (cmd/scheduler) with that device configuration, as kube-scheduler's
extender (filter + bind, as HAMi's Helm chart configures it). Go HAMi's webhook is not used:
pods are created as it would leave them (``schedulerName`` set, memory rewritten).
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from hami.testkit.cluster import SCHEDULER_NAME
from hami.testkit.controlplane import ControlPlane, ManagedProcess, free_port


class GoScheduler:
    """One Go HAMi scheduler process with its own device configuration."""

    def __init__(
        self,
        binary: Path,
        plane: ControlPlane,
        device_config: str,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.plane = plane
        self.device_config = device_config
        self.port = free_port()
        self.metrics_port = free_port()
        name = uuid.uuid4().hex[:6]
        self.log = plane.workdir / f"hami-go-scheduler-{name}.log"
        self.config_path = plane.workdir / f"hami-go-device-config-{name}.yaml"
        self.args = [
            f"--http_bind=127.0.0.1:{self.port}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            f"--scheduler-name={SCHEDULER_NAME}",
            "--leader-elect=false",
            "--v=4",
            *extra_args,
        ]
        self.process: ManagedProcess | None = None

    def kube_scheduler_config(self, resources: Sequence[str]) -> dict[str, Any]:
        """kube-scheduler with this Go scheduler as extender, managing ``resources``."""
        return {
            "podInitialBackoffSeconds": 1,
            "podMaxBackoffSeconds": 2,
            "profiles": [{"schedulerName": SCHEDULER_NAME}],
            "extenders": [
                {
                    "urlPrefix": f"http://127.0.0.1:{self.port}",
                    "filterVerb": "filter",
                    "bindVerb": "bind",
                    "nodeCacheCapable": True,
                    "weight": 1,
                    "httpTimeout": "30s",
                    "managedResources": [
                        {"name": name, "ignoredByScheduler": True} for name in resources
                    ],
                }
            ],
        }

    async def __aenter__(self) -> GoScheduler:
        await asyncio.to_thread(self._start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.process is not None:
            process, self.process = self.process, None
            await asyncio.to_thread(process.stop)

    def _start(self) -> None:
        self.config_path.write_text(self.device_config)
        argv = [
            "env",
            f"KUBECONFIG={self.plane.kubeconfig}",
            str(self.binary),
            *self.args,
            f"--device-config-file={self.config_path}",
        ]
        self.process = ManagedProcess("hami-go-scheduler", argv, self.log)
        self.process.start()
        url = f"http://127.0.0.1:{self.port}/healthz"
        for _ in range(300):
            if not self.process.running():
                raise self.process.fail("stopped before /healthz answered")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise self.process.fail(f"not healthy after 60s at {url}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def diagnosis(self, lines: int = 30) -> str:
        tail = self.process.log_tail(lines) if self.process is not None else "(not started)"
        return f"Go HAMi scheduler log {self.log}, last lines:\n{tail}"

    async def wait_log(self, *parts: str, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Wait until one line of Go's log holds every one of ``parts``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(all(p in line for p in parts) for line in self.log_text().splitlines()):
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"no Go HAMi log line with {parts}; {self.diagnosis()}")
