"""A Huawei Ascend node as HAMi's ascend-device-plugin and its kubelet leave it, for the
tests of the scheduler side against that plug-in, where no agent runs. (This project's own
node side reads ``npu-smi``: hami.backends.ascend; hami.testkit.ascend_agent runs it over a
stand-in ``npu-smi``, as ``hami demo`` does.)

The Node carries what Go HAMi 2.10's scheduler reads from that plug-in: the register value
``hami.io/node-register-{type}`` (Go's JSON of its device list: one entry per chip, the
vNPUs of the smallest template as ``count``, a ``NetworkID`` for 910 chips, zero values
left out), the heartbeat ``hami.io/node-handshake-{type}`` as ``Reported_`` with the
plug-in's dotted time layout, ``hami-vnpu-core``, and the vNPU count kubelet advertises
for ``huawei.com/{type}``. ``AscendNode`` creates that Node and rewrites the register and
heartbeat every period, as the plug-in does; nothing runs pods on it (no kubelet, no
Allocate), so a pod the scheduler binds there stays Pending with its decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hami import log
from hami.backends.ascend_chips import CHIPS
from hami.kube.client import Kube, node_path
from hami.kube.raw import Conflict, KubeError

_log = log.get(__name__)

NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def ascend_register(word: str, uuids: list[str], memory: int, core: int, count: int) -> str:
    """The plug-in's register value: Go's JSON of its device list, fields in Go's struct
    order, zero values left out, ``NetworkID`` 1 from the fifth chip on (0 on 910C)."""
    entries = []
    for i, uuid in enumerate(uuids):
        entry: dict[str, Any] = {"id": uuid}
        if i:
            entry["index"] = i
        network = 0 if word == "Ascend910C" else int(i > 3)
        entry.update(
            count=count,
            devmem=memory,
            devcore=core,
            type=word,
            health=True,
            custominfo={"NetworkID": network},
        )
        entries.append(entry)
    return json.dumps(entries, separators=(",", ":"))


def ascend_reported(now: datetime) -> str:
    """The plug-in's heartbeat value, in its dotted time layout (a naive time is UTC)."""
    stamp = now if now.tzinfo is None else now.astimezone(UTC)
    return "Reported_" + stamp.strftime("%Y.%m.%d %H:%M:%S")


def ascend_annotations(word: str, register: str, now: datetime) -> dict[str, str]:
    """Every annotation the plug-in keeps on its Node."""
    return {
        f"hami.io/node-register-{word}": register,
        f"hami.io/node-handshake-{word}": ascend_reported(now),
        "hami-vnpu-core": "false",
    }


@dataclass(frozen=True)
class AscendNodeSpec:
    """One Ascend node: ``chips`` chips of the Go device type ``word``. ``agent``: served by
    this project's node agent over a stand-in ``npu-smi`` (hami.testkit.ascend_agent), pods
    bound there start; otherwise a stand-in Node annotated as the ascend-device-plugin
    would (``AscendNode``), where nothing starts them."""

    name: str
    word: str = "Ascend910B3"
    chips: int = 2
    agent: bool = False

    @property
    def uuids(self) -> list[str]:
        # the plug-in names chips by their UUID; the node name keeps them apart
        return [f"{self.name}-npu-{i}" for i in range(self.chips)]

    def describe(self) -> str:
        chip = CHIPS[self.word]
        return f"{self.chips}x {self.word} ({chip.memory_allocatable // 1024} GiB)"


class AscendNode:
    """See the module docstring: ``start()`` creates the Node, ``stop()`` ends the
    heartbeat (the caller deletes the Node)."""

    def __init__(
        self,
        spec: AscendNodeSpec,
        kube: Kube,
        *,
        labels: Mapping[str, str],
        period: float = 1.0,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.kube = kube
        self.labels = {"kubernetes.io/hostname": spec.name, **labels}
        self.period = period
        chip = CHIPS[spec.word]
        self.resource = chip.resources.count
        self.register = ascend_register(
            spec.word, spec.uuids, chip.memory_allocatable, chip.ai_core, chip.slots
        )
        self.vnpus = chip.slots * spec.chips
        self._task: asyncio.Task[None] | None = None

    def annotations(self) -> dict[str, str]:
        return ascend_annotations(self.spec.word, self.register, datetime.now(UTC))

    async def start(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": self.labels,
                "annotations": self.annotations(),
            },
        }
        try:
            await self.kube.create("/api/v1/nodes", body)
        except Conflict:
            await self.kube.merge_patch(node_path(self.name), {"metadata": body["metadata"]})
        resources = {"cpu": "32", "memory": "128Gi", "pods": "110", self.resource: str(self.vnpus)}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        status = {"capacity": resources, "allocatable": resources, "conditions": [ready]}
        await self.kube.merge_patch(node_path(self.name) + "/status", {"status": status})
        await self._untaint()
        self._task = asyncio.create_task(self._heartbeat(), name=f"ascend-node[{self.name}]")

    async def _untaint(self) -> None:
        """The API server taints every new Node not-ready; a kubelet reporting Ready has
        it removed, and nothing else here would."""
        for _ in range(5):
            node = await self.kube.get_node(self.name)
            taints = (node.get("spec") or {}).get("taints") or []
            keep = [t for t in taints if t.get("key") not in NOT_READY_TAINTS]
            if keep == taints:
                return
            patch = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": keep or None},
            }
            with contextlib.suppress(Conflict):
                await self.kube.merge_patch(node_path(self.name), patch)
                return
        raise RuntimeError(f"{self.name}: could not remove the not-ready taint")

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.kube.patch_node_annotations(self.name, self.annotations())
            except KubeError as exc:
                _log.warning("ascend stand-in heartbeat failed", node=self.name, error=str(exc))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
