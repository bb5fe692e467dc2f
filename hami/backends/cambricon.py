"""Cambricon MLU cards, enumerated with ``cnmon info -j`` (protocol.md section 6).

``cnmon info -j`` writes its JSON to ``cnmon_info.json`` in its working directory (and a
table to stdout), so it runs in a fresh temporary directory; when no file appears, stdout
is parsed instead (versions or wrappers that print the JSON). Memory totals are MiB. A card
has no core limiter: it registers 0 cores, as HAMi's MLU devices do, and has no health
source, so every enumerated card is healthy.

Options (``BackendSettings.options``), with their defaults:

    cnmon: cnmon                # the command, a name on PATH or a path
    cnmon_timeout: 10           # seconds before cnmon is killed
    host_root: /                # where the node agent sees the host's root (device checks)
    sysfs_root: /sys            # PCI sysfs, for each card's NUMA node
    dev_path: /dev/cambricon_dev{slot}
    ctl_path: /dev/cambricon_ctl
    ipcm_path: /dev/cambricon_ipcm{slot}      # given only when it exists on the host
    env_split_enable: CAMBRICON_SPLIT_ENABLE
    env_visible_devices: CAMBRICON_SPLIT_VISIBLE_DEVICES
    env_mems: CAMBRICON_SPLIT_MEMS
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from hami.backends import cambricon_go, toolrun
from hami.backends._nvml import numa_node
from hami.backends.base import (
    AllocationRequest,
    Backend,
    BackendError,
    BackendSettings,
    ContainerAllocation,
    Device,
    DeviceNode,
    ResourceNames,
)
from hami.core.requests import NO_ANNOTATIONS
from hami.protocol import ContainerDevice, NodeDevice

log = structlog.get_logger(__name__)

MLU_RESOURCES = ResourceNames(
    count="cambricon.com/vmlu",
    memory="cambricon.com/mlu.smlu.vmemory",
    cores="cambricon.com/mlu.smlu.vcore",
    memory_unit_mib=256,
)

_STRING_OPTIONS = {
    "cnmon": "cnmon",
    "host_root": "/",
    "sysfs_root": "/sys",
    "dev_path": "/dev/cambricon_dev{slot}",
    "ctl_path": "/dev/cambricon_ctl",
    "ipcm_path": "/dev/cambricon_ipcm{slot}",
    "env_split_enable": "CAMBRICON_SPLIT_ENABLE",
    "env_visible_devices": "CAMBRICON_SPLIT_VISIBLE_DEVICES",
    "env_mems": "CAMBRICON_SPLIT_MEMS",
}
_OUTPUT_FILE = "cnmon_info.json"


class CambriconBackend(Backend):
    type_word = "mlu"
    vendor_word = "MLU"
    default_resources = MLU_RESOURCES
    allocated_key = "hami.io/cambricon-mlu-devices-allocated"
    to_allocate_key = "hami.io/cambricon-mlu-devices-to-allocate"
    default_cores = 100  # cambricon.com/mlu.smlu.vcore absent: the whole card
    # Go HAMi 2.10 binds Cambricon pods under cambricon.com/dsmlu.lock, not hami.io/mutex.lock:
    # Cambricon's plug-in removes that one after Allocate, and so does this node agent.
    node_lock = False
    vendor_lock = cambricon_go.NODE_LOCK
    known_options = frozenset({*_STRING_OPTIONS, "cnmon_timeout"})
    # Go HAMi 2.10 reads Cambricon uuid selectors as cambricon.com/{use,nouse}-gpuuuid; the
    # mluuuid keys this project documented first stay read (DeviceKind.selector_aliases).
    selector_keys: tuple[tuple[str, str], ...] = (
        ("use-uuid", "cambricon.com/use-gpuuuid"),
        ("nouse-uuid", "cambricon.com/nouse-gpuuuid"),
    )
    selector_aliases: tuple[tuple[str, str], ...] = (
        ("use-uuid", "cambricon.com/use-mluuuid"),
        ("nouse-uuid", "cambricon.com/nouse-mluuuid"),
    )

    def __init__(self, settings: BackendSettings | None = None) -> None:
        super().__init__(settings)
        options = self.settings.options
        unknown = set(options) - set(_STRING_OPTIONS) - {"cnmon_timeout"}
        if unknown:
            known = sorted({*_STRING_OPTIONS, "cnmon_timeout"})
            raise BackendError(f"mlu: unknown option(s) {sorted(unknown)}; known: {known}")
        self.opts: dict[str, str] = {}
        for key, default in _STRING_OPTIONS.items():
            value = options.get(key, default)
            if not isinstance(value, str) or not value:
                raise BackendError(f"mlu: option {key!r} must be a non-empty string")
            self.opts[key] = value
        for key in ("dev_path", "ipcm_path"):
            if "{slot}" not in self.opts[key]:
                raise BackendError(f"mlu: option {key!r} must contain {{slot}}")
        timeout = options.get("cnmon_timeout", 10)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise BackendError(f"mlu: option 'cnmon_timeout' must be seconds > 0, got {timeout!r}")
        self.cnmon_timeout = float(timeout)

    def core_limit(self, device: Device) -> int:
        return 0  # no core limiter on MLU

    # Scheduler side as Go HAMi 2.10 models Cambricon (hami.backends.cambricon_go)

    def devices_from_node(self, node: Mapping[str, Any]) -> list[NodeDevice] | None:
        """The register value when the node has one (this project's agent), else the cards
        Go HAMi 2.10 reads from kubelet capacity (Cambricon's own device plugin)."""
        found = super().devices_from_node(node)
        if found is not None:
            return found
        return cambricon_go.devices_from_capacity(node, self.resources)

    def pod_annotations(
        self,
        containers: Sequence[Sequence[ContainerDevice]],
        index_of: Callable[[str], int],
        annotations: Mapping[str, str] = NO_ANNOTATIONS,
    ) -> dict[str, str]:
        return cambricon_go.dsmlu_annotations(containers, index_of)

    def capacity_units(self, device: Device) -> dict[str, int]:
        """vcore and vmemory units, so that Go's scheduler finds the cards (Go 2.10 reads
        only these capacities for Cambricon)."""
        registered = self.to_node_devices([device])[0].memory
        return cambricon_go.capacity_units(registered, self.resources)

    # Enumeration

    async def enumerate(self) -> list[Device]:
        raw = await self._run_cnmon()
        return self._parse(raw)

    async def _run_cnmon(self) -> str:
        command = self.opts["cnmon"]
        workdir = await asyncio.to_thread(tempfile.mkdtemp, prefix="hami-cnmon-")
        try:
            stdout = await toolrun.run_tool(
                (command, "info", "-j"),
                label="mlu",
                timeout=self.cnmon_timeout,
                timeout_option="cnmon_timeout",
                missing="the node needs the Cambricon driver and cnmon installed, visible to "
                "the node agent (on its PATH, or set the backend option 'cnmon' to its path)",
                cwd=workdir,
            )
            written = await asyncio.to_thread(_read_if_present, os.path.join(workdir, _OUTPUT_FILE))
            return written if written is not None else stdout
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    def _parse(self, raw: str) -> list[Device]:
        try:
            cards = json.loads(raw)["CnmonInfo"]
            if not isinstance(cards, list):
                raise TypeError("CnmonInfo is not a list")
            devices = [self._card(card) for card in cards]
        except (ValueError, KeyError, TypeError) as exc:
            snippet = raw.strip()[:200] or "(empty)"
            raise BackendError(
                f"mlu: cannot read 'cnmon info -j' output ({exc!r}); it starts with: {snippet}"
            ) from exc
        return sorted(devices, key=lambda d: d.index)

    def _card(self, card: Mapping[str, Any]) -> Device:
        return Device(
            uuid=f"MLU-{_string(card['UUID'])}",
            index=int(card["CardNum"]),
            model=f"MLU-{_string(card['ProductName'])}",
            memory_mib=int(card["PhysicalMemUsage"]["Total"]),
            numa=self._numa(card.get("PCI")),
        )

    def _numa(self, pci: Any) -> int:
        try:
            address = (
                f"{int(str(pci['DomainID']), 16):04x}:{int(str(pci['Bus']), 16):02x}:"
                f"{int(str(pci['Device']), 16):02x}.{int(str(pci['Function']), 16):x}"
            )
        except (KeyError, TypeError, ValueError):
            return 0  # older cnmon without PCI details
        return numa_node(self.opts["sysfs_root"], address)

    # Allocation

    def decision_devices(
        self,
        devices: Sequence[ContainerDevice],
        node_devices: Sequence[Device],
        node: str,
        annotations: Mapping[str, str],
    ) -> list[ContainerDevice]:
        """Go HAMi 2.10 names the cards it reads from this node's capacity
        ``{node}-cambricon-mlu-{i}``: card ``i`` in index order, as the capacity counts them."""
        uuids = [d.uuid for d in sorted(node_devices, key=lambda d: d.index)]
        try:
            return cambricon_go.our_cards(devices, node, uuids, annotations)
        except ValueError as exc:
            raise BackendError(str(exc)) from None

    def allocate(self, request: AllocationRequest) -> ContainerAllocation:
        pod = f"{request.pod_namespace}/{request.pod_name}"
        if not request.devices:
            raise BackendError(f"pod {pod} container {request.container_name}: no MLU to allocate")
        cards = {d.uuid: d for d in request.node_devices}
        slots: list[int] = []
        split = False
        for device in request.devices:
            card = cards.get(device.uuid)
            if card is None:
                raise BackendError(
                    f"pod {pod} container {request.container_name}: device {device.uuid} is "
                    f"not on this node (known: {', '.join(sorted(cards)) or 'none'})"
                )
            slots.append(card.index)
            # A whole card is the memory the node registered (after memory scaling) in
            # whole vmemory units: what either scheduler gives 100 % of the card (Go reads
            # only the units the agent advertises).
            registered = self.to_node_devices([card])[0].memory
            split = split or device.memory < cambricon_go.whole_card_mib(registered)

        nodes = [self._node(self.opts["dev_path"].format(slot=s)) for s in slots]
        nodes.append(self._node(self.opts["ctl_path"]))
        for slot in slots:
            ipcm = self.opts["ipcm_path"].format(slot=slot)
            if self._on_host(ipcm):
                nodes.append(self._node(ipcm))

        envs = {
            self.opts["env_visible_devices"]: ",".join(str(s) for s in slots),
            self.opts["env_mems"]: ",".join(str(d.memory) for d in request.devices),
        }
        if split:
            envs[self.opts["env_split_enable"]] = "1"
        return ContainerAllocation(envs=envs, devices=nodes)

    @staticmethod
    def _node(path: str) -> DeviceNode:
        return DeviceNode(host_path=path, container_path=path, permissions="rw")

    def _on_host(self, path: str) -> bool:
        return os.path.exists(os.path.join(self.opts["host_root"], path.lstrip("/")))


def _read_if_present(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _string(value: Any) -> str:
    if not isinstance(value, str | int) or not str(value).strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return str(value).strip()
