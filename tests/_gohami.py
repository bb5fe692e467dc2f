"""Go HAMi's own scheduler in a local cluster with this project's node agents (docs/interop.md).

    binary, why = go_scheduler_binary()      # built by scripts/build-hami-go.sh from HAMI_SRC
    async with GoHamiCluster(NODES, binary, plane=controlplane) as cluster:
        await cluster.create_pod(gpu_pod("p", [limits(1, mem=3000)]))
        ...

What runs: the test control plane, Go HAMi's scheduler (cmd/scheduler) as kube-scheduler's
extender (filter + bind, as HAMi's Helm chart configures it), and one simulated GPU node per
``NodeSpec``: this project's node agent with the fake backend (or, for ``mode="mig"``, the
NVIDIA backend in MIG mode over the fake NVML), writing its register value in Go HAMi >= 2.8's
JSON form, and the kubelet emulator. Go HAMi's webhook is not used: pods are
created with ``schedulerName`` already set, as the webhook would leave them.

Nothing of Go HAMi is in this repository: its source tree is named by ``HAMI_SRC`` and the
binary is built into ``~/.cache/hami/hami-go/<commit>/`` (or named by ``HAMI_GO_SCHEDULER``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hami import config
from hami.backends.base import BackendSettings
from hami.backends.fake import FakeBackend
from hami.kube.client import open_client
from hami.kube.objects import annotations_of
from hami.kube.raw import KubeError
from hami.protocol import register
from hami.testkit.cluster import SCHEDULER_NAME, LocalCluster, NodeSpec, SimNode, Timing, poll
from hami.testkit.controlplane import ControlPlane, ManagedProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "scripts" / "build-hami-go.sh"
ENV_SRC = "HAMI_SRC"
ENV_BINARY = "HAMI_GO_SCHEDULER"
REGISTER_KEY = "hami.io/node-nvidia-register"

#: The container limits Go HAMi's NVIDIA device reads (its Helm chart's defaults).
RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
)

#: Go HAMi's device config (its chart's nvidia section; other vendors left out).
DEVICE_CONFIG = """\
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
  overwriteEnv: false
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  memoryFactor: 1
  deviceSplitCount: 10
  deviceMemoryScaling: 1
  deviceCoreScaling: 1
"""


def skip_reason() -> str | None:
    """One line saying why the tier cannot run here, or None when it may try."""
    if os.environ.get(ENV_BINARY) or os.environ.get(ENV_SRC):
        return None
    return (
        f"Go HAMi interop: set {ENV_SRC} to a Go HAMi source tree (or {ENV_BINARY} to its "
        "built scheduler) to run it; see docs/interop.md"
    )


def go_scheduler_binary() -> tuple[Path | None, str]:
    """(path of Go HAMi's scheduler binary, "") or (None, why not). Builds it from HAMI_SRC
    with scripts/build-hami-go.sh when it is not cached yet (minutes; a no-op after)."""
    given = os.environ.get(ENV_BINARY)
    if given:
        path = Path(given)
        if path.is_file() and os.access(path, os.X_OK):
            return path, ""
        return None, f"{ENV_BINARY}={given} is not an executable file"
    src = os.environ.get(ENV_SRC)
    if not src:
        return None, skip_reason() or ""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        env={**os.environ, ENV_SRC: src},
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"Go HAMi scheduler not built from {ENV_SRC}={src}: {last}"
    return Path(lines[-1]), ""


def go_version(binary: Path) -> str:
    """What ``scheduler version`` prints, on one line."""
    done = subprocess.run(
        [str(binary), "version"], capture_output=True, text=True, check=False, timeout=30
    )
    return " ".join((done.stdout + done.stderr).split())


# --------------------------------------------------------------------------- cluster


class GoHamiCluster(LocalCluster):
    """LocalCluster with Go HAMi's scheduler in place of this project's scheduler role."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        binary: Path,
        *,
        plane: ControlPlane,
        timing: Timing | None = None,
        node_policy: str = "binpack",
        device_policy: str = "spread",
        verbosity: int = 4,
    ) -> None:
        super().__init__(nodes, plane=plane, timing=timing)
        self.binary = binary
        self.go_port = free_port()
        self.go_metrics_port = free_port()
        self.go_log = plane.workdir / f"hami-go-scheduler-{self.id}.log"
        self.go_args = [
            f"--http_bind=127.0.0.1:{self.go_port}",
            f"--metrics-bind-address=127.0.0.1:{self.go_metrics_port}",
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--node-scheduler-policy={node_policy}",
            f"--gpu-scheduler-policy={device_policy}",
            "--leader-elect=false",
            f"--v={verbosity}",
        ]
        self.go: ManagedProcess | None = None
        for node in self.nodes.values():
            # a MIG node's NVIDIA backend already writes the JSON form (hami.testkit.mig_node)
            if node.spec.mode != "mig":
                node.backend = FakeBackend(_with_format(node.backend.settings, register.JSON))

    def _config(self, *args: Any, **kwargs: Any) -> config.Config:
        # whatever LocalCluster's config takes, only the fake backend's register form differs
        cfg = super()._config(*args, **kwargs)
        backends = dict(cfg.backends)
        backends["fake"] = dataclasses.replace(backends["fake"], register_format=register.JSON)
        return dataclasses.replace(cfg, backends=backends)

    def kube_scheduler_config(self) -> dict[str, Any]:
        """As HAMi's Helm chart configures kube-scheduler (plus the short test back-off)."""
        return {
            "podInitialBackoffSeconds": self.timing.pod_initial_backoff,
            "podMaxBackoffSeconds": self.timing.pod_max_backoff,
            "profiles": [{"schedulerName": SCHEDULER_NAME}],
            "extenders": [
                {
                    "urlPrefix": f"http://127.0.0.1:{self.go_port}",
                    "filterVerb": "filter",
                    "bindVerb": "bind",
                    "nodeCacheCapable": True,
                    "weight": 1,
                    "httpTimeout": "30s",
                    "managedResources": [
                        {"name": name, "ignoredByScheduler": True} for name in RESOURCES
                    ],
                }
            ],
        }

    async def start(self) -> None:
        assert self.plane is not None, "GoHamiCluster needs a running ControlPlane"
        self._kube_cm = open_client(self.kubeconfig)
        self._kube = await self._kube_cm.__aenter__()
        await self._ensure_namespace()
        await asyncio.to_thread(self._start_go)
        self.kube_scheduler = await asyncio.to_thread(
            self.plane.start_scheduler, self.kube_scheduler_config(), f"kube-scheduler-{self.id}"
        )
        for node in self.nodes.values():
            await node.start_kubelet()
            await node.start_agent()
        await self.wait_go_sees(self.nodes)

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            if self.go is not None:
                go, self.go = self.go, None
                await asyncio.to_thread(go.stop)

    def _start_go(self) -> None:
        assert self.plane is not None
        config_path = self.plane.workdir / f"hami-go-device-config-{self.id}.yaml"
        config_path.write_text(DEVICE_CONFIG)
        argv = [
            "env",
            f"KUBECONFIG={self.kubeconfig}",
            str(self.binary),
            *self.go_args,
            f"--device-config-file={config_path}",
        ]
        self.go = ManagedProcess("hami-go-scheduler", argv, self.go_log)
        self.go.start()
        url = f"http://127.0.0.1:{self.go_port}/healthz"
        for _ in range(300):
            if not self.go.running():
                raise self.go.fail("stopped before /healthz answered")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise self.go.fail(f"not healthy after 60s at {url}")

    # ------------------------------------------------------------------ Go's view

    def go_metrics(self) -> str:
        url = f"http://127.0.0.1:{self.go_metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode(errors="replace"))

    async def go_devices(self) -> dict[str, set[str]]:
        """node -> device uuids Go HAMi's scheduler holds (from its metrics)."""
        try:
            text = await asyncio.to_thread(self.go_metrics)
        except OSError:
            return {}
        out: dict[str, set[str]] = {}
        for line in text.splitlines():
            if not line.startswith("hami_gpu_memory_limit_bytes{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            out.setdefault(labels.get("node", ""), set()).add(labels.get("device_uuid", ""))
        return out

    async def wait_go_sees(self, nodes: Iterable[str], timeout: float = 60.0) -> float:  # noqa: ASYNC109
        """Wait until Go HAMi's scheduler holds every device of these nodes."""
        names = list(nodes)

        async def seen() -> bool:
            held = await self.go_devices()
            return all(set(self.nodes[n].uuids) <= held.get(n, set()) for n in names)

        try:
            return await poll(seen, timeout, f"Go HAMi scheduler holding the devices of {names}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; {self.diagnosis()}") from None

    async def wait_go_log(self, *parts: str, timeout: float = 60.0) -> float:  # noqa: ASYNC109
        """Wait until one line of Go HAMi's log holds every one of ``parts``."""

        def found() -> bool:
            text = self.go_log.read_text(errors="replace") if self.go_log.exists() else ""
            return any(all(p in line for p in parts) for line in text.splitlines())

        try:
            return await poll(found, timeout, f"a Go HAMi log line with {parts}", interval=0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; {self.diagnosis()}") from None

    # ------------------------------------------------------------------ extra nodes

    async def add_node(self, spec: NodeSpec, *, register_format: str = register.JSON) -> SimNode:
        """Start one more simulated node (kubelet emulator + agent) with this register form."""
        node = SimNode(self, spec, len(self.nodes))
        node.backend = FakeBackend(_with_format(node.backend.settings, register_format))
        self.nodes[spec.name] = node
        await node.start_kubelet()
        await node.start_agent()
        return node

    async def remove_node(self, name: str) -> None:
        node = self.nodes.pop(name)
        await node.stop()
        with contextlib.suppress(KubeError):
            await self.kube.delete(f"/api/v1/nodes/{name}")

    def diagnosis(self, lines: int = 30) -> str:
        tail = self.go.log_tail(lines) if self.go is not None else "(not started)"
        return f"Go HAMi scheduler log {self.go_log}, last lines:\n{tail}"

    async def register_value(self, node: str) -> str:
        obj = await self.kube.get_node(node)
        return annotations_of(obj).get(REGISTER_KEY, "")


def _with_format(settings: BackendSettings, register_format: str) -> BackendSettings:
    return dataclasses.replace(settings, register_format=register_format)
