"""A whole local cluster in one process: for the end-to-end tests and ``hami demo``.

    async with LocalCluster(DEMO_NODES, timing=Timing(handshake_timeout=3.0)) as cluster:
        cluster.kubeconfig                # the control plane's kubeconfig
        cluster.kube                      # hami.kube.client.Kube for it
        cluster.role                      # the hami scheduler role (extender on role.url)
        await cluster.create_pod(gpu_pod("p", [limits(1, mem=3000)]))
        pod = await cluster.wait_pod("p")         # until it leaves Pending
        admission = await cluster.admission(pod)  # the Allocate answers kubelet got
        await cluster.nodes["gpu-t4"].stop_agent()  # and start_agent(); restart_role()

What runs: etcd + kube-apiserver (started here, or an existing ``ControlPlane`` passed in),
the hami scheduler role on a fixed free port (so it can be restarted where kube-scheduler
expects it), a kube-scheduler whose profile ``hami-scheduler`` uses the role as its
extender (filter + bind, every backend resource ``ignoredByScheduler``), and one simulated
GPU node per ``NodeSpec``: a ``NodeAgent`` with the ``fake`` backend and a
``KubeletEmulator`` in a short directory under /tmp. Every node carries the label
``hami.io/local-cluster: <id>`` and pods built by ``gpu_pod`` select it, so other nodes the
same API server may hold never take them.

Periods are injectable (``Timing``): the tests run the handshake with a 3 s timeout and
kube-scheduler with a 1 s pod back-off.

``NodeSpec(mode="mig")`` runs a node's agent with the NVIDIA backend in MIG mode over the
fake NVML (hami.testkit.mig_node); ``ascend=[AscendNodeSpec(...)]`` adds Ascend nodes and
enables that type's scheduler side: with ``agent=True`` served by this project's node agent
with the Ascend backend over a stand-in ``npu-smi`` and a kubelet emulator
(hami.testkit.ascend_agent), so pods bound there start; otherwise as HAMi's
ascend-device-plugin annotates them (hami.testkit.ascend_node), where nothing starts pods.
Both are for the extender mode; ``hami demo`` runs one of each (its Ascend node with the
agent).

``LocalCluster(mode="dra")`` is the DRA variant (docs/dra.md): no hami scheduler role and no
extender; kube-scheduler's profile ``hami-scheduler`` is the default plugin set, which
allocates ResourceClaims against the ResourceSlices the node agents publish (backend
``fake`` in ``mode: dra``), kube-controller-manager runs the resourceclaim controller, and
each kubelet emulator discovers the node's DRA plugin and prepares claims through it (its
own registration, plugin and CDI directories under the node's directory). With
``webhook=True`` it runs hami's role for its webhook, which turns pods written for the
extender mode into claims (docs/dra.md "Unchanged HAMi pods").

``dra_nodes`` runs the named nodes of an extender-mode cluster in the DRA mode: both modes
on one API server, one kube-scheduler; the webhook sends a device pod to either by its
namespace's ``hami.io/device-mode`` label (``add_namespace``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import inspect
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hami import config, log
from hami.backends.base import Backend, BackendSettings
from hami.backends.fake import FakeBackend
from hami.kube.client import Kube, open_client, pods_path
from hami.kube.objects import annotations_of, metadata_of
from hami.kube.raw import KubeError, NotFound
from hami.node.agent import NodeAgent
from hami.protocol import ContainerDevice, decode_pod_devices
from hami.scheduler.role import SchedulerRole
from hami.testkit.ascend_agent import AscendAgentNode
from hami.testkit.ascend_node import AscendNode, AscendNodeSpec
from hami.testkit.controlplane import (
    ControllerManagerProcess,
    ControlPlane,
    SchedulerProcess,
    free_port,
)
from hami.testkit.kubelet import KubeletEmulator, PodAdmission
from hami.testkit.mig_node import mig_backend

_log = log.get(__name__)

CLUSTER_LABEL = "hami.io/local-cluster"
SCHEDULER_NAME = "hami-scheduler"
ALLOCATED = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
MODES = ("extender", "dra")
#: NodeSpec.mode: the fake backend sharing by HAMi-core, or the NVIDIA backend in MIG mode
#: on the fake NVML (hami.testkit.mig_node)
NODE_MODES = ("hami-core", "mig")
#: the DRA driver (and DeviceClass) of the fake backend: it calls itself nvidia
DRA_DRIVER = "nvidia.hami.io"
DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"

Progress = Callable[[str], None]


# kube-scheduler multiplies an extender's 0..10 by weight x 10 (MaxNodeScore / 10): at 5
# the defrag score's worst-to-best step (9 points, 450) outweighs what the default plugins
# (NodeResourcesFit, BalancedAllocation: 0..100 each) can differ by.
DRA_SCORE_WEIGHT = 5


def dra_score_extender(url: str, weight: int = DRA_SCORE_WEIGHT) -> dict[str, Any]:
    """kube-scheduler's extender entry for the DRA mode's score (docs/dra.md): prioritize
    only, no filter, bind or managed resources, and ignorable, so a hami scheduler that is
    down never holds a pod up."""
    return {
        "urlPrefix": url,
        "prioritizeVerb": "prioritize",
        "weight": weight,
        "nodeCacheCapable": True,
        "ignorable": True,
        "httpTimeout": "5s",
    }


def _quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class NodeSpec:
    """One simulated GPU node: fake device groups (count, model, memory MiB, numa), shared
    by HAMi-core, or with ``mode="mig"`` GPUs in MIG mode (a model with a MIG profile table,
    extender mode only)."""

    name: str
    devices: tuple[Mapping[str, Any], ...]
    split_count: int = 10
    mode: str = "hami-core"

    def __post_init__(self) -> None:
        if self.mode not in NODE_MODES:
            raise ValueError(f"node {self.name}: mode {self.mode!r}, expected one of {NODE_MODES}")

    @property
    def device_count(self) -> int:
        return sum(int(group.get("count", 1)) for group in self.devices)


#: Three nodes of different models and sizes (the demo's and the e2e tests' cluster).
DEMO_NODES: tuple[NodeSpec, ...] = (
    NodeSpec("gpu-a100", ({"count": 2, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},)),
    NodeSpec("gpu-v100", ({"count": 4, "model": "NVIDIA-Tesla V100-PCIE-32GB", "memory": 32768},)),
    NodeSpec("gpu-t4", ({"count": 2, "model": "NVIDIA-Tesla T4", "memory": 15360},)),
)
#: The extender demo's node with one A100 in MIG mode.
DEMO_MIG_NODE = NodeSpec(
    "gpu-a100-mig", ({"count": 1, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},), mode="mig"
)
#: The extender demo's Ascend node (this project's agent over a stand-in npu-smi).
DEMO_ASCEND_NODE = AscendNodeSpec("npu-910b3", "Ascend910B3", chips=2, agent=True)


@dataclass(frozen=True)
class Timing:
    """Periods of every loop; production defaults are far longer (protocol.md section 2)."""

    register_period: float = 1.0
    handshake_period: float = 1.0
    handshake_timeout: float = 3.0
    kubelet_poll: float = 0.2
    kubelet_heartbeat: float = 10.0
    pod_initial_backoff: int = 1  # kube-scheduler podInitialBackoffSeconds
    pod_max_backoff: int = 1  # kube-scheduler podMaxBackoffSeconds
    bind_lock_wait: float = 20.0


# --------------------------------------------------------------------------- pods


def limits(
    count: int | None = 1,
    *,
    mem: int | None = None,
    pct: int | None = None,
    cores: int | None = None,
) -> dict[str, str]:
    """A container's ``nvidia.com/*`` limits."""
    out: dict[str, str] = {}
    if count is not None:
        out["nvidia.com/gpu"] = str(count)
    if mem is not None:
        out["nvidia.com/gpumem"] = str(mem)
    if pct is not None:
        out["nvidia.com/gpumem-percentage"] = str(pct)
    if cores is not None:
        out["nvidia.com/gpucores"] = str(cores)
    return out


def gpu_pod(
    name: str,
    containers: Sequence[Mapping[str, str]],
    *,
    init: Sequence[Mapping[str, str]] = (),
    annotations: Mapping[str, str] | None = None,
    scheduler_name: str | None = SCHEDULER_NAME,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod whose containers have these limits (``{}``: a container without devices).

    Containers are named ``c0, c1, ...`` and init containers ``init0, ...``. The local
    cluster adds its node selector when the pod is created through it."""

    def container(prefix: str, index: int, lim: Mapping[str, str]) -> dict[str, Any]:
        body: dict[str, Any] = {"name": f"{prefix}{index}", "image": "busybox"}
        if lim:
            body["resources"] = {"limits": dict(lim)}
        return body

    spec: dict[str, Any] = {
        "containers": [container("c", i, lim) for i, lim in enumerate(containers)],
        "terminationGracePeriodSeconds": 0,
    }
    if init:
        spec["initContainers"] = [container("init", i, lim) for i, lim in enumerate(init)]
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": spec,
    }


def pod_devices(pod: Mapping[str, Any], key: str = ALLOCATED) -> list[list[ContainerDevice]]:
    """The decoded ``*-devices-*`` value of a pod (one list per container)."""
    value = annotations_of(pod).get(key)
    return decode_pod_devices(value) if value is not None else []


def phase_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


# --------------------------------------------------------------------------- nodes


class SimNode:
    """A simulated GPU node: kubelet emulator + node agent with the fake backend."""

    def __init__(self, cluster: LocalCluster, spec: NodeSpec, index: int) -> None:
        self.cluster = cluster
        self.spec = spec
        self.name = spec.name
        self.uuid_prefix = f"GPU-{cluster.id}-{index}"
        self.dir = cluster.workdir / str(index)
        self.kubelet: KubeletEmulator | None = None
        self.agent: NodeAgent | None = None
        self._task: asyncio.Task[None] | None = None
        self.cfg = cluster.cfg
        self.dra = cluster.is_dra(spec.name)
        if self.dra:
            # each node its own kubelet directories (a real node has them at fixed paths)
            dra = config.DRANodeConfig(
                plugins_dir=str(self.dir / "dra"),
                registry_dir=str(self.dir / "reg"),
                cdi_dir=str(self.dir / "cdi"),
            )
            node_cfg = dataclasses.replace(self.cfg.node, dra=dra)
            backends = dict(self.cfg.backends)
            backends["fake"] = dataclasses.replace(backends["fake"], mode="dra")
            self.cfg = dataclasses.replace(self.cfg, node=node_cfg, backends=backends)
        self.backend_name = "fake"
        self.backend: Backend
        if spec.mode == "mig":
            if self.dra:
                raise ValueError(f"node {spec.name}: MIG nodes run in the extender mode only")
            # no usage monitor: containers on MIG instances run without HAMi-core's files
            monitor = dataclasses.replace(self.cfg.node.monitor, enabled=False)
            node_cfg = dataclasses.replace(self.cfg.node, monitor=monitor)
            self.cfg = dataclasses.replace(self.cfg, node=node_cfg)
            self.backend_name = "nvidia"
            self.backend = mig_backend(spec.devices, self.uuid_prefix, self.dir)
        else:
            self.backend = FakeBackend(
                BackendSettings(
                    split_count=spec.split_count,
                    options={
                        "devices": [dict(group) for group in spec.devices],
                        "uuid_prefix": self.uuid_prefix,
                        "hamicore": {"containers_dir": str(self.dir / "vgpu")},
                    },
                )
            )

    @property
    def uuids(self) -> list[str]:
        return [f"{self.uuid_prefix}-{i}" for i in range(self.spec.device_count)]

    @property
    def agent_running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start_kubelet(self) -> KubeletEmulator:
        dra: dict[str, Any] = {}
        if self.dra:
            dra = {
                "dra_registry_dir": self.cfg.node.dra.registry_dir,
                "cdi_dirs": [self.cfg.node.dra.cdi_dir],
            }
        self.kubelet = KubeletEmulator(
            self.name,
            self.cluster.kubeconfig,
            self.dir / "plugins",
            labels={CLUSTER_LABEL: self.cluster.id},
            heartbeat_interval=self.cluster.timing.kubelet_heartbeat,
            **dra,
        )
        await self.kubelet.start()
        return self.kubelet

    async def start_agent(self) -> None:
        """Start the node agent and wait until kubelet sees all its virtual devices."""
        if self.agent_running:
            return
        assert self.kubelet is not None, "start the kubelet first"
        timing = self.cluster.timing
        self.agent = NodeAgent(
            self.cfg,
            node_name=self.name,
            kube=self.cluster.kube,
            backends={self.backend_name: self.backend},
            register_period=timing.register_period,
            device_plugin_dir=str(self.kubelet.plugin_dir),
            serve_http=False,
            kubelet_poll=timing.kubelet_poll,
            min_backoff=min(1.0, timing.register_period),
        )
        self._task = asyncio.create_task(self.agent.run(), name=f"node-agent[{self.name}]")
        await self.agent.wait_ready()
        if self.dra:
            await self.kubelet.wait_for_dra_driver(DRA_DRIVER)
            await self.wait_published()
            return
        # a MIG GPU offers as many slots as its smallest allowed profile has instances
        healthy = (
            None if self.spec.mode == "mig" else self.spec.device_count * self.spec.split_count
        )
        await self.kubelet.wait_for_resource("nvidia.com/gpu", healthy=healthy)

    async def wait_published(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """DRA mode: until the agent's ResourceSlice matches its devices."""
        agent = self.agent
        assert agent is not None
        await poll(lambda: "fake" in agent.dra, timeout, f"{self.name}: DRA mode started")
        publisher = agent.dra["fake"][1]
        async with asyncio.timeout(timeout):
            await publisher.published.wait()

    async def stop_agent(self) -> None:
        agent, task = self.agent, self._task
        self.agent, self._task = None, None
        if agent is not None:
            await agent.stop()
        if task is not None:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def stop(self) -> None:
        await self.stop_agent()
        if self.kubelet is not None:
            kubelet, self.kubelet = self.kubelet, None
            await kubelet.stop()


# --------------------------------------------------------------------------- cluster


class LocalCluster:
    """See the module docstring. Use ``async with``, or ``start()`` and ``stop()``."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec] = DEMO_NODES,
        *,
        plane: ControlPlane | None = None,
        timing: Timing | None = None,
        node_policy: str = "binpack",
        device_policy: str = "spread",
        namespace: str | None = None,
        webhook: bool = False,
        progress: Progress | None = None,
        mode: str = "extender",
        defrag_cpu_pods: bool = False,
        dra_score: bool = False,
        dra_nodes: Sequence[str] = (),
        ascend: Sequence[AscendNodeSpec] = (),
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
        if ascend and mode != "extender":
            raise ValueError("ascend: Ascend nodes are scheduled by the extender mode only")
        if dra_score and mode != "dra":
            raise ValueError("dra_score: the DRA mode's node score needs mode='dra'")
        self.mode = mode
        self.dra_score = dra_score
        unknown = set(dra_nodes) - {spec.name for spec in nodes}
        if unknown:
            raise ValueError(f"dra_nodes: no such nodes {sorted(unknown)}")
        #: nodes whose agent runs the fake backend in mode dra (all in mode="dra")
        self.dra_nodes = frozenset(dra_nodes)
        self._namespaces: list[str] = []  # made by add_namespace, deleted on stop
        self.id = uuid.uuid4().hex[:6]
        self.specs = list(nodes)
        self.ascend_specs = list(ascend)
        self._given_plane = plane
        self.plane: ControlPlane | None = plane
        self.timing = timing or Timing()
        self.namespace = namespace or f"hami-{self.id}"
        self.webhook = webhook
        self.progress = progress or _quiet
        self.workdir = Path(tempfile.mkdtemp(prefix=f"hc-{self.id}-", dir="/tmp"))
        self.port = free_port()
        self.webhook_port = free_port() if webhook else 0
        self.cfg = self._config(node_policy, device_policy, defrag_cpu_pods)
        self._kube: Kube | None = None
        self.role: SchedulerRole | None = None
        self.kube_scheduler: SchedulerProcess | None = None
        self.controller_manager: ControllerManagerProcess | None = None
        self.nodes: dict[str, SimNode] = {
            spec.name: SimNode(self, spec, i) for i, spec in enumerate(self.specs)
        }
        #: stand-ins for Ascend nodes (hami.testkit.ascend_node), once started
        self.ascend: dict[str, AscendNode] = {}
        #: Ascend nodes run by this project's agent (hami.testkit.ascend_agent)
        self.ascend_agents: dict[str, AscendAgentNode] = {}
        self._kube_cm: contextlib.AbstractAsyncContextManager[Kube] | None = None
        self._webhook_config: str | None = None

    @property
    def kube(self) -> Kube:
        """The cluster's API client (while started)."""
        if self._kube is None:
            raise RuntimeError("the local cluster is not started")
        return self._kube

    # ------------------------------------------------------------------ config

    def _config(
        self, node_policy: str, device_policy: str, defrag_cpu_pods: bool = False
    ) -> config.Config:
        t = self.timing
        scheduler: dict[str, Any] = {
            "scheduler_name": SCHEDULER_NAME,
            "http": {"address": "127.0.0.1", "port": 0},  # probes and metrics
            "extender": {"address": "127.0.0.1", "port": self.port},  # kept across restarts
            "handshake_period": f"{t.handshake_period}s",
            "handshake_timeout": f"{t.handshake_timeout}s",
            "bind_lock_wait": f"{t.bind_lock_wait}s",
            "node_policy": node_policy,
            "device_policy": device_policy,
            "defrag_cpu_pods": defrag_cpu_pods,
            "dra_score": self.dra_score,
            "webhook": {"enabled": False},
        }
        if self.webhook:
            scheduler["webhook"] = {
                "enabled": True,
                "address": "127.0.0.1",
                "port": self.webhook_port,
                "tls_mode": "files",  # a certificate of the test CA, written below
                "cert_file": str(self.workdir / "webhook.crt"),
                "key_file": str(self.workdir / "webhook.key"),
                "device_mode": self.mode,  # namespaces without hami.io/device-mode
            }
        backends: dict[str, Any] = {
            "nvidia": {"enabled": False},
            "fake": {"enabled": True, "mode": self.mode},
        }
        for spec in self.ascend_specs:  # the scheduler side of each Ascend type
            backends[spec.word] = {"enabled": True}
        return config.from_mapping(
            {
                "scheduler": scheduler,
                "node": {"register_period": f"{t.register_period}s"},
                "backends": backends,
            },
            env={},
        )

    def kube_scheduler_config(self) -> dict[str, Any]:
        """kube-scheduler with hami as its extender, as config/kube-scheduler.yaml has it
        (plus a short pod back-off, so retried pods come back in about a second). In DRA
        mode: the default plugins only (DynamicResources allocates the claims), and with
        ``dra_score`` hami as a score-only extender (prioritizeVerb; ignorable)."""
        if self.mode == "dra":
            body: dict[str, Any] = {
                "podInitialBackoffSeconds": self.timing.pod_initial_backoff,
                "podMaxBackoffSeconds": self.timing.pod_max_backoff,
                "profiles": [{"schedulerName": SCHEDULER_NAME}],
            }
            if self.dra_score:
                body["extenders"] = [dra_score_extender(f"http://127.0.0.1:{self.port}")]
            return body
        assert self.role is not None
        resources = [
            name for kind in self.role.scheduler.kinds for name in kind.managed_resources()
        ]
        extender: dict[str, Any] = {
            "urlPrefix": f"http://127.0.0.1:{self.port}",
            "filterVerb": "filter",
            "bindVerb": "bind",
            "nodeCacheCapable": True,
            "httpTimeout": f"{int(self.timing.bind_lock_wait) + 10}s",
            "weight": 1,
            "managedResources": [{"name": name, "ignoredByScheduler": True} for name in resources],
        }
        profile: dict[str, Any] = {"schedulerName": SCHEDULER_NAME}
        if self.cfg.scheduler.defrag_cpu_pods:
            # the extender is asked about every pod of the profile (pods without devices
            # too); NodeResourcesFit still ignores the device resources kubelet never has
            del extender["managedResources"]
            profile["pluginConfig"] = [
                {"name": "NodeResourcesFit", "args": {"ignoredResources": resources}}
            ]
        return {
            "podInitialBackoffSeconds": self.timing.pod_initial_backoff,
            "podMaxBackoffSeconds": self.timing.pod_max_backoff,
            "profiles": [profile],
            "extenders": [extender],
        }

    @property
    def kubeconfig(self) -> Path:
        assert self.plane is not None
        return self.plane.kubeconfig

    @property
    def node_selector(self) -> dict[str, str]:
        return {CLUSTER_LABEL: self.id}

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> LocalCluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        began = time.monotonic()
        if self.plane is None:
            self.progress("starting etcd and kube-apiserver ...")
            self.plane = ControlPlane()
            await asyncio.to_thread(self.plane.start)
            self.progress(f"  control plane ready in {self.plane.startup_seconds or 0:.1f}s")
        self._kube_cm = open_client(self.kubeconfig)
        self._kube = await self._kube_cm.__aenter__()
        await self._ensure_namespace()
        if self.webhook:
            self._write_webhook_cert()
        assert self.plane is not None
        if self.mode == "dra":
            self.progress("starting kube-controller-manager (resourceclaim controller) ...")
            self.controller_manager = self.plane.start_controller_manager(
                name=f"kube-controller-manager-{self.id}"
            )
            if self.dra_score or self.webhook:
                self.progress(
                    f"starting the hami scheduler role (DRA score, webhook) on :{self.port} ..."
                )
                await self.start_role()
            self.progress("starting kube-scheduler (default plugins: DRA allocates) ...")
        else:
            if self.dra_nodes:
                self.controller_manager = self.plane.start_controller_manager(
                    name=f"kube-controller-manager-{self.id}"
                )
            self.progress(f"starting the hami scheduler role on 127.0.0.1:{self.port} ...")
            await self.start_role()
            self.progress("starting kube-scheduler with hami as its extender ...")
        self.kube_scheduler = await asyncio.to_thread(
            self.plane.start_scheduler, self.kube_scheduler_config(), f"kube-scheduler-{self.id}"
        )
        if self.webhook:
            await self._register_webhook()
        for node in self.nodes.values():
            self.progress(
                f"starting node {node.name}: {_describe(node.spec)} "
                f"(kubelet emulator + hami node agent{', DRA' if self.mode == 'dra' else ''})"
            )
            await node.start_kubelet()
            await node.start_agent()
        for i, spec in enumerate(self.ascend_specs):
            if spec.agent:
                self.progress(
                    f"starting node {spec.name}: {spec.describe()} (kubelet emulator + hami "
                    "node agent, Ascend backend over a stand-in npu-smi)"
                )
                agent_node = AscendAgentNode(
                    spec,
                    self.cfg,
                    self.kube,
                    self.kubeconfig,
                    self.workdir / f"npu{i}",
                    labels=self.node_selector,
                    seed=0x20 + i,
                    register_period=self.timing.register_period,
                    kubelet_poll=self.timing.kubelet_poll,
                    kubelet_heartbeat=self.timing.kubelet_heartbeat,
                )
                self.ascend_agents[spec.name] = agent_node
                await agent_node.start()
                continue
            self.progress(
                f"starting node {spec.name}: {spec.describe()} (a stand-in: the Node as HAMi's "
                "ascend-device-plugin annotates it; no kubelet or agent runs there, so pods "
                "bound there are not started)"
            )
            stand_in = AscendNode(
                spec, self.kube, labels=self.node_selector, period=self.timing.register_period
            )
            self.ascend[spec.name] = stand_in
            await stand_in.start()
        if self.mode != "dra":
            await self.wait_available([n for n in self.nodes if not self.is_dra(n)], True)
            await poll(
                lambda: all(self.type_available(s.name, s.word) for s in self.ascend_specs),
                30.0,
                "Ascend nodes available",
            )
        self.progress(f"cluster ready in {time.monotonic() - began:.1f}s")

    async def stop(self) -> None:
        """Stop everything this cluster started (bounded); remove its temp dir."""
        if self._kube is not None:
            with contextlib.suppress(Exception):
                await self.delete_pods(wait=False)
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                await node.stop()
        for stand_in in self.ascend.values():
            await stand_in.stop()
        for agent_node in self.ascend_agents.values():
            with contextlib.suppress(Exception):
                await agent_node.stop()
        if self.kube_scheduler is not None:
            sched, self.kube_scheduler = self.kube_scheduler, None
            await asyncio.to_thread(sched.stop)
            if self.plane is not None:
                with contextlib.suppress(ValueError):
                    self.plane.schedulers.remove(sched)
        await self.stop_role()
        if self.controller_manager is not None:
            kcm, self.controller_manager = self.controller_manager, None
            await asyncio.to_thread(kcm.stop)
            if self.plane is not None:
                with contextlib.suppress(ValueError):
                    self.plane.controller_managers.remove(kcm)
        if self._kube is not None:
            with contextlib.suppress(Exception):
                await self._cleanup_objects()
        if self._kube_cm is not None:
            cm, self._kube_cm = self._kube_cm, None
            await cm.__aexit__(None, None, None)
            self._kube = None
        if self.plane is not None and self._given_plane is None:
            plane, self.plane = self.plane, None
            await asyncio.to_thread(plane.stop)
        shutil.rmtree(self.workdir, ignore_errors=True)

    async def start_role(self) -> SchedulerRole:
        role = SchedulerRole(self.cfg, self.kube)
        await role.start()
        try:
            await role.wait_ready()
        except BaseException:
            await role.stop()
            raise
        self.role = role
        return role

    async def stop_role(self) -> None:
        if self.role is not None:
            role, self.role = self.role, None
            await role.stop()

    async def restart_role(self) -> SchedulerRole:
        """Stop the scheduler role and start a new one (empty memory) on the same port."""
        await self.stop_role()
        return await self.start_role()

    def is_dra(self, node: str) -> bool:
        """Whether the node's agent runs in the DRA mode."""
        return self.mode == "dra" or node in self.dra_nodes

    async def _ensure_namespace(
        self, name: str | None = None, labels: Mapping[str, str] | None = None
    ) -> None:
        # the cluster's label lets the test webhook's namespaceSelector find it
        labels = {**(labels or {}), CLUSTER_LABEL: self.id}
        name = name or self.namespace
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels},
        }
        try:
            await self.kube.create("/api/v1/namespaces", body)
        except KubeError as exc:
            if exc.status != 409:
                raise
            await self.kube.merge_patch(
                f"/api/v1/namespaces/{name}", {"metadata": {"labels": labels}}
            )

    async def add_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Another namespace the cluster's webhook serves (e.g. labelled
        ``hami.io/device-mode: dra``); deleted on stop."""
        await self._ensure_namespace(name, labels)
        self._namespaces.append(name)

    async def _cleanup_objects(self) -> None:
        for name in [*self.nodes, *self.ascend, *self.ascend_agents]:
            with contextlib.suppress(KubeError):
                await self.kube.delete(f"/api/v1/nodes/{name}")
        for name in self._namespaces:
            with contextlib.suppress(KubeError):
                await self.kube.delete(f"/api/v1/namespaces/{name}")
        if self.mode == "dra" or self.dra_nodes:
            # the agents' DeviceClass is cluster-scoped: gone with the cluster, so a later
            # cluster on the same API server starts from the agents' own body
            with contextlib.suppress(KubeError):
                await self.kube.delete(f"{DEVICE_CLASSES}/{DRA_DRIVER}")
        if self._webhook_config:
            with contextlib.suppress(KubeError):
                await self.kube.delete(
                    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                    + self._webhook_config
                )
        if self._given_plane is not None and self.namespace.startswith("hami-"):
            with contextlib.suppress(KubeError):
                await self.kube.delete(f"/api/v1/namespaces/{self.namespace}")

    # ------------------------------------------------------------------ webhook

    def _write_webhook_cert(self) -> None:
        assert self.plane is not None
        cert, key = self.plane.ca.issue("hami-webhook", hosts=["127.0.0.1"], server=True)
        (self.workdir / "webhook.crt").write_bytes(cert)
        (self.workdir / "webhook.key").write_bytes(key)

    async def _register_webhook(self) -> None:
        """A MutatingWebhookConfiguration calling the role, for the pods of this cluster's
        namespace that carry the label ``hami.io/local-cluster: <id>``."""
        import base64

        assert self.plane is not None
        name = f"hami-{self.id}"
        body = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "vgpu.hami.io",
                    "admissionReviewVersions": ["v1"],
                    # the DRA path creates ResourceClaimTemplates, never in a dry run
                    "sideEffects": "NoneOnDryRun",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self.webhook_port}/webhook",
                        "caBundle": base64.b64encode(self.plane.ca.cert_pem).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    "namespaceSelector": {"matchLabels": {CLUSTER_LABEL: self.id}},
                    # only pods that opt in: other tests create pods without the webhook
                    "objectSelector": {"matchLabels": {CLUSTER_LABEL: self.id}},
                }
            ],
        }
        await self.kube.create(
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", body
        )
        self._webhook_config = name

    async def map_extended_resource(self, resource: str | None) -> None:
        """DRA mode: set (or with None remove) the DeviceClass's ``extendedResourceName``,
        so pods asking ``resource: N`` get a claim from kube-scheduler (DRAExtendedResource).
        Off by default: see docs/dra.md on mixing it with the extender mode."""
        await self.kube.merge_patch(
            f"{DEVICE_CLASSES}/{DRA_DRIVER}", {"spec": {"extendedResourceName": resource}}
        )

    # ------------------------------------------------------------------ nodes

    def available(self, node: str) -> bool:
        """Whether the scheduler role sees the node's nvidia type as available."""
        return self.type_available(node, "nvidia")

    def type_available(self, node: str, word: str) -> bool:
        """Whether the scheduler role sees the node's device type ``word`` as available."""
        if self.role is None:
            return False
        state = self.role.scheduler.cluster.nodes.get(node)
        return bool(state and word in state.types and state.types[word].available)

    async def wait_available(
        self,
        nodes: Iterable[str],
        available: bool,
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> float:
        """Wait until the role sees every node in ``nodes`` (un)available; return seconds."""
        names = list(nodes)
        return await poll(
            lambda: all(self.available(n) == available for n in names),
            timeout,
            f"nodes {names} {'available' if available else 'unavailable'}",
        )

    def registered(self) -> dict[str, dict[str, tuple[int, int, int]]]:
        """node -> uuid -> (split count, memory MiB, core limit), as the role registered."""
        assert self.role is not None
        out: dict[str, dict[str, tuple[int, int, int]]] = {}
        for row in self.role.scheduler.cluster.rows():
            d = row.device
            out.setdefault(row.node, {})[d.uuid] = (d.count, d.total_memory, d.total_cores)
        return out

    def model_of(self, uuid_: str) -> str:
        for spec in self.ascend_specs:
            if uuid_ in spec.uuids:
                return spec.word
        for agent_node in self.ascend_agents.values():
            if uuid_ in agent_node.uuids:
                return agent_node.spec.word
        for node in self.nodes.values():
            if uuid_ in node.uuids:
                index = node.uuids.index(uuid_)
                for group in node.spec.devices:
                    if index < int(group.get("count", 1)):
                        return str(group["model"])
                    index -= int(group.get("count", 1))
        return "?"

    # ------------------------------------------------------------------ pods

    def _pods_path(self) -> str:
        return pods_path(self.namespace)

    async def create_pod(
        self, pod: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Create a pod in the cluster's namespace (or ``namespace``), restricted to the
        cluster's nodes."""
        body = copy.deepcopy(dict(pod))
        spec = dict(body.get("spec") or {})
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **self.node_selector}
        body["spec"] = spec
        return await self.kube.create(pods_path(namespace or self.namespace), body)

    async def get_pod(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self.kube.get_pod(namespace or self.namespace, name)

    async def list_pods(self) -> list[dict[str, Any]]:
        return await self.kube.list_pods(namespace=self.namespace)

    async def delete_pod(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self.kube.delete(f"{self._pods_path()}/{name}", {"gracePeriodSeconds": 0})

    async def delete_pods(self, wait: bool = True, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Delete every pod of the namespace; with ``wait``, until they are gone from the API
        server and from the scheduler role's accounting."""
        for pod in await self.list_pods():
            await self.delete_pod(pod["metadata"]["name"])
        if not wait:
            return

        async def gone() -> bool:
            if await self.list_pods():
                return False
            prefix = f"{self.namespace}/"
            return self.role is None or not any(
                k.startswith(prefix) for k in self.role.scheduler.cluster.pods
            )

        await poll(gone, timeout, f"pods of {self.namespace} deleted")

    def tracked(self, name: str) -> bool:
        """Whether the scheduler role holds a record (usage or reservation) for the pod."""
        return self.role is not None and (
            f"{self.namespace}/{name}" in self.role.scheduler.cluster.pods
        )

    async def wait_pod(
        self,
        name: str,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
        timeout: float = 30.0,  # noqa: ASYNC109
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """Poll until the pod satisfies ``predicate`` (default: it is no longer Pending)."""
        check = predicate or (lambda pod: phase_of(pod) != "Pending")
        found: dict[str, Any] = {}

        async def ready() -> bool:
            found["pod"] = await self.get_pod(name, namespace)
            return check(found["pod"])

        try:
            await poll(ready, timeout, f"pod {name}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; last seen: {_summary(found.get('pod'))}") from None
        pod: dict[str, Any] = found["pod"]
        return pod

    async def wait_running(
        self,
        names: Iterable[str],
        timeout: float = 60.0,  # noqa: ASYNC109
    ) -> dict[str, dict[str, Any]]:
        """Poll until every named pod left Pending; returns them by name."""
        wanted = set(names)
        seen: dict[str, dict[str, Any]] = {}

        async def done() -> bool:
            for pod in await self.list_pods():
                name = pod["metadata"]["name"]
                if name in wanted:
                    seen[name] = pod
            return all(n in seen and phase_of(seen[n]) != "Pending" for n in wanted)

        try:
            await poll(done, timeout, f"{len(wanted)} pods started")
        except TimeoutError as exc:
            pending = sorted(n for n in wanted if n not in seen or phase_of(seen[n]) == "Pending")
            raise TimeoutError(f"{exc}; still pending: {pending[:10]}") from None
        return {n: seen[n] for n in wanted}

    async def events(self, name: str) -> list[dict[str, Any]]:
        """Events of the named pod in the cluster's namespace."""
        path = f"/api/v1/namespaces/{self.namespace}/events"
        query = [("fieldSelector", f"involvedObject.name={name}")]
        items, _ = await self.kube.list_all(path, query=query)
        return items

    async def admission(
        self,
        pod: Mapping[str, Any],
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> PodAdmission:
        """What the kubelet emulator of the pod's node did with it (waits until it is done:
        the pod's status can be read a moment before the emulator records it)."""
        meta = metadata_of(pod)
        node_name = str((pod.get("spec") or {}).get("nodeName") or "")
        node = self.nodes.get(node_name)
        if node is None or node.kubelet is None:
            raise LookupError(f"pod {meta.get('name')} is not on a node of this cluster")
        return await node.kubelet.wait_for_admission(
            str(meta.get("namespace")), str(meta.get("name")), timeout
        )


def _describe(spec: NodeSpec) -> str:
    what = ", ".join(
        f"{int(g.get('count', 1))}x {g['model']} ({int(g['memory']) // 1024} GiB)"
        for g in spec.devices
    )
    return f"{what} in MIG mode" if spec.mode == "mig" else what


def _summary(pod: Mapping[str, Any] | None) -> str:
    if pod is None:
        return "(not found)"
    status = pod.get("status") or {}
    conditions = [
        f"{c.get('type')}={c.get('status')} {c.get('message') or ''}".strip()
        for c in status.get("conditions") or []
    ]
    return (
        f"phase={status.get('phase')} node={(pod.get('spec') or {}).get('nodeName')} "
        f"annotations={annotations_of(pod)} conditions={conditions}"
    )


async def poll(
    check: Callable[[], bool | Awaitable[bool]],
    timeout: float = 10.0,  # noqa: ASYNC109
    what: str = "condition",
    interval: float = 0.1,
) -> float:
    """Re-check ``check`` every ``interval`` until it holds; return the seconds it took.
    Raises TimeoutError naming ``what`` after ``timeout`` seconds. The one polling loop of
    the testkit, the tests and the benchmarks."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return loop.time() - began
        if loop.time() - began > timeout:
            raise TimeoutError(f"{what}: not reached within {timeout:g}s")
        await asyncio.sleep(interval)


__all__ = [
    "ALLOCATED",
    "CLUSTER_LABEL",
    "DEMO_ASCEND_NODE",
    "DEMO_MIG_NODE",
    "DEMO_NODES",
    "SCHEDULER_NAME",
    "TO_ALLOCATE",
    "LocalCluster",
    "NodeSpec",
    "SimNode",
    "Timing",
    "annotations_of",
    "gpu_pod",
    "limits",
    "phase_of",
    "pod_devices",
    "poll",
]
