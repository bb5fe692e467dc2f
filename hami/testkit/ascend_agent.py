"""An Ascend node served by this project's own node side: a kubelet emulator and a
``NodeAgent`` running the Ascend backend of the node's type, whose chips come from the
stand-in ``npu-smi`` of hami.testkit.fake_npu_smi (no Huawei driver needed). Pods the
scheduler binds there are admitted and started, with the environment Ascend Docker Runtime
reads (``ASCEND_VISIBLE_DEVICES``, ``ASCEND_VNPU_SPECS``).

``LocalCluster(ascend=[AscendNodeSpec(..., agent=True)])`` runs one per spec; ``hami demo``
runs its Ascend node this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping
from pathlib import Path

from hami import config
from hami.backends.ascend import BACKENDS
from hami.backends.ascend_chips import CHIPS
from hami.backends.base import BackendSettings
from hami.kube.client import Kube
from hami.node.agent import NodeAgent
from hami.testkit.ascend_node import AscendNodeSpec
from hami.testkit.fake_npu_smi import FakeChip, b3_node, fake_npu_smi
from hami.testkit.kubelet import KubeletEmulator


class AscendAgentNode:
    """See the module docstring: ``start()`` starts the kubelet emulator and the agent and
    waits until kubelet has every vNPU; ``stop()`` stops both (the caller deletes the Node)."""

    def __init__(
        self,
        spec: AscendNodeSpec,
        cfg: config.Config,
        kube: Kube,
        kubeconfig: str | Path,
        workdir: Path,
        *,
        labels: Mapping[str, str],
        seed: int = 0x11,
        register_period: float = 1.0,
        kubelet_poll: float = 0.2,
        kubelet_heartbeat: float = 10.0,
    ) -> None:
        if spec.word not in BACKENDS:
            raise ValueError(f"node {spec.name}: no Ascend backend for {spec.word!r}")
        self.spec = spec
        self.name = spec.name
        self.kube = kube
        self.kubeconfig = kubeconfig
        self.dir = workdir
        self.labels = dict(labels)
        self.register_period = register_period
        self.kubelet_poll = kubelet_poll
        self.kubelet_heartbeat = kubelet_heartbeat
        # no usage monitor: the containers run without HAMi-core's files
        monitor = dataclasses.replace(cfg.node.monitor, enabled=False)
        self.cfg = dataclasses.replace(cfg, node=dataclasses.replace(cfg.node, monitor=monitor))
        chip = CHIPS[spec.word]
        self.chips: list[FakeChip] = b3_node(spec.chips, seed=seed, name=chip.chip_name)
        self.resource = chip.resources.count
        self.vnpus = chip.slots * spec.chips
        self.kubelet: KubeletEmulator | None = None
        self.agent: NodeAgent | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def uuids(self) -> list[str]:
        """The chips' UUIDs, as the agent reads them from their Die IDs."""
        return [c.uuid for c in self.chips]

    async def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        script, dev = fake_npu_smi(self.dir, self.chips)
        self.kubelet = KubeletEmulator(
            self.name,
            self.kubeconfig,
            self.dir / "plugins",
            labels=self.labels,
            heartbeat_interval=self.kubelet_heartbeat,
        )
        await self.kubelet.start()
        backend = BACKENDS[self.spec.word](
            BackendSettings(options={"npu_smi": str(script), "dev_dir": str(dev)})
        )
        self.agent = NodeAgent(
            self.cfg,
            node_name=self.name,
            kube=self.kube,
            backends={self.spec.word: backend},
            register_period=self.register_period,
            device_plugin_dir=str(self.kubelet.plugin_dir),
            serve_http=False,
            kubelet_poll=self.kubelet_poll,
            min_backoff=min(1.0, self.register_period),
        )
        self._task = asyncio.create_task(self.agent.run(), name=f"ascend-agent[{self.name}]")
        await self.agent.wait_ready()
        await self.kubelet.wait_for_resource(self.resource, healthy=self.vnpus)

    async def stop(self) -> None:
        agent, task, kubelet = self.agent, self._task, self.kubelet
        self.agent, self._task, self.kubelet = None, None, None
        if agent is not None:
            with contextlib.suppress(Exception):
                await agent.stop()
        if task is not None:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if kubelet is not None:
            await kubelet.stop()
