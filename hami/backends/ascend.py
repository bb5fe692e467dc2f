"""Huawei Ascend NPUs as Go HAMi 2.10 models them (issue 24): scheduler and node side.

Every Ascend type is a device type of its own, named as Go names it (``Ascend910B3``): one
class per type below, each behind an entry point of that name, all sharing ``AscendBackend``.

Scheduler side: the register value under ``hami.io/node-register-{type}`` (one entry per
chip, counting the chip's vNPUs of the smallest template, with a ``NetworkID`` for 910
chips), the heartbeat ``hami.io/node-handshake-{type}``, and the decision in
``hami.io/{type}-devices-to-allocate`` and ``huawei.com/{type}`` (hami.backends.ascend_rules),
whichever node side wrote the Node: HAMi's ascend-device-plugin or this project's agent.

Node side: the chips come from ``npu-smi`` (hami.backends.ascend_enum), only those whose
Chip Name is the type's; the Node gets what the ascend-device-plugin writes and Allocate
answers with the environment Ascend Docker Runtime reads (hami.backends.ascend_node). Only
vNPU templates (the hard split) are offered. The chart's numbers are used as the plug-in
uses them: memory and cores per chip are the type's, ``split_count`` is the chip's vNPUs of
the smallest template, and memory or core scaling is refused.

Options (``BackendSettings.options``), with their defaults:

    npu_smi: npu-smi        # the command, a name on PATH or a path
    npu_smi_timeout: 10     # seconds before one npu-smi run is killed
    dev_dir: /dev           # where the node agent sees the host's /dev/davinci<id>
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import structlog

from hami.backends import ascend_node
from hami.backends.ascend_chips import CHIPS, Chip
from hami.backends.ascend_enum import NpuSmi
from hami.backends.ascend_rules import node_offers, pod_needs, request_rule, runtime_info
from hami.backends.base import (
    AllocationRequest,
    Backend,
    BackendError,
    BackendSettings,
    ContainerAllocation,
    Device,
)
from hami.core.requests import NO_ANNOTATIONS, DeviceRequest
from hami.protocol import ContainerDevice, NodeDevice

log = structlog.get_logger(__name__)

_OPTIONS = {"npu_smi": "npu-smi", "dev_dir": "/dev"}
_TIMEOUT = "npu_smi_timeout"


class AscendBackend(Backend):
    """One Ascend type; a subclass names its ``chip`` (``CHIPS``)."""

    chip: ClassVar[Chip]
    default_cores = 0  # no core share unless asked (the soft split)
    known_options = frozenset({*_OPTIONS, _TIMEOUT})

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        word = cls.chip.word
        cls.type_word = word
        cls.vendor_word = word  # Go's device type in pod values is the type word
        cls.default_resources = cls.chip.resources
        cls.allocated_key = f"hami.io/{word}-devices-allocated"
        cls.to_allocate_key = f"hami.io/{word}-devices-to-allocate"

    def __init__(self, settings: BackendSettings | None = None) -> None:
        super().__init__(settings)
        word = self.type_word
        if self.resources != self.default_resources:
            # the request rules and the pod value name what Go's scheduler and plug-in read
            raise BackendError(
                f"{word}: the resource names are Go HAMi's and the plug-in's "
                f"({', '.join(self.default_resources.all())}); remove backends.{word}.resources"
            )
        if self.settings.memory_scaling != 1.0 or self.settings.core_scaling != 1.0:
            raise BackendError(
                f"{word}: memory_scaling and core_scaling do not apply: a chip registers the "
                f"chart's memory and AI cores, which the vNPU templates are cut from; remove them"
            )
        # kubelet sees a chip as its vNPUs of the smallest template, as with the plug-in
        self.settings = dataclasses.replace(self.settings, split_count=self.chip.slots)
        options = self.settings.options
        known = sorted(self.known_options or ())
        unknown = set(options) - set(known)
        if unknown:
            raise BackendError(f"{word}: unknown option(s) {sorted(unknown)}; known: {known}")
        opts: dict[str, str] = {}
        for key, default in _OPTIONS.items():
            value = options.get(key, default)
            if not isinstance(value, str) or not value:
                raise BackendError(f"{word}: option {key!r} must be a non-empty string")
            opts[key] = value
        timeout = options.get(_TIMEOUT, 10)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise BackendError(f"{word}: option {_TIMEOUT!r} must be seconds > 0, got {timeout!r}")
        self.npu_smi = NpuSmi(opts["npu_smi"], float(timeout), opts["dev_dir"])
        self._physical: dict[str, int] = {}  # uuid -> physical id, from the last enumeration

    @property
    def register_key(self) -> str:
        return f"hami.io/node-register-{self.type_word}"

    @property
    def selector_keys(self) -> tuple[tuple[str, str], ...]:
        """Go reads the uuid selectors under ``hami.io/use-{type}-uuid`` and
        ``hami.io/no-use-{type}-uuid``."""
        return (
            ("use-uuid", f"hami.io/use-{self.type_word}-uuid"),
            ("nouse-uuid", f"hami.io/no-use-{self.type_word}-uuid"),
        )

    def request_rule(
        self, request: DeviceRequest, annotations: Mapping[str, str], where: str
    ) -> DeviceRequest:
        return request_rule(self.chip, request, annotations, where)

    def pod_needs(self, annotations: Mapping[str, str]) -> frozenset[str]:
        return pod_needs(annotations)

    def node_offers(self, annotations: Mapping[str, str]) -> frozenset[str]:
        return node_offers(annotations)

    def pod_annotations(
        self,
        containers: Sequence[Sequence[ContainerDevice]],
        index_of: Callable[[str], int],
        annotations: Mapping[str, str] = NO_ANNOTATIONS,
    ) -> dict[str, str]:
        return runtime_info(self.chip, containers, annotations)

    # Node side (hami.backends.ascend_enum, hami.backends.ascend_node)

    async def enumerate(self) -> list[Device]:
        found = await self.npu_smi.chips()
        mine = [c for c in found if c.name == self.chip.chip_name]
        if found and not mine:
            names = sorted({c.name for c in found})
            words = sorted(c.word for c in CHIPS.values() if c.chip_name in names)
            instead = f"enable {', '.join(words)} instead" if words else "no type matches them"
            raise BackendError(
                f"{self.type_word}: npu-smi finds chips named {', '.join(names)}, none named "
                f"{self.chip.chip_name!r} as {self.type_word}'s are; {instead}"
            )
        uuids = [c.uuid for c in mine]
        twice = sorted({u for u in uuids if uuids.count(u) > 1})
        if twice:
            # one uuid for two chips would make a decision ambiguous: serve none of them
            raise BackendError(
                f"{self.type_word}: npu-smi gives several chips the Die ID {', '.join(twice)}; "
                f"check 'npu-smi info -t board' on the node"
            )
        self._physical = {c.uuid: c.phy for c in mine}
        return [
            Device(
                uuid=c.uuid,
                index=i,
                model=self.type_word,
                memory_mib=self.chip.memory_allocatable,
                healthy=c.healthy,
            )
            for i, c in enumerate(mine)
        ]

    def core_limit(self, device: Device) -> int:
        return self.chip.ai_core

    def register_value(self, node_devices: Sequence[NodeDevice]) -> str:
        return ascend_node.register_value(self.chip, node_devices)

    def node_annotations(self, devices: Sequence[Device]) -> dict[str, str]:
        return dict(ascend_node.NODE_ANNOTATIONS)

    def allocate(self, request: AllocationRequest) -> ContainerAllocation:
        where = f"pod {request.pod_namespace}/{request.pod_name} container {request.container_name}"
        answer = ascend_node.allocation(
            self.chip, request.devices, self._physical, request.pod_annotations, where
        )
        log.debug("ascend_allocate", where=where, envs=dict(answer.envs))
        return answer


class Ascend910A(AscendBackend):
    chip = CHIPS["Ascend910A"]


class Ascend910B2(AscendBackend):
    chip = CHIPS["Ascend910B2"]


class Ascend910B3(AscendBackend):
    chip = CHIPS["Ascend910B3"]


class Ascend910B4(AscendBackend):
    chip = CHIPS["Ascend910B4"]


class Ascend910B4_1(AscendBackend):  # Go: Ascend910B4-1
    chip = CHIPS["Ascend910B4-1"]


class Ascend310P(AscendBackend):
    chip = CHIPS["Ascend310P"]


class Ascend910C(AscendBackend):
    chip = CHIPS["Ascend910C"]


BACKENDS: dict[str, type[AscendBackend]] = {
    cls.chip.word: cls
    for cls in (
        Ascend910A,
        Ascend910B2,
        Ascend910B3,
        Ascend910B4,
        Ascend910B4_1,
        Ascend310P,
        Ascend910C,
    )
}
