"""Iluvatar CoreX GPUs, scheduler side only, as Go HAMi 2.10 models them (issue 24).

Every Iluvatar chip of Go's chart is a device type of its own, named as Go names it
(``BI-V150``): one class per type below, each behind an entry point of that name, all sharing
``IluvatarBackend``. The node side is Iluvatar's / HAMi's device plug-in: it writes the
register value under ``hami.io/node-{type}-register``, heartbeats
``hami.io/node-handshake-{type}`` and reads the decision from
``hami.io/{type}-devices-to-allocate``; the pod's device values carry the type word.

A container asks with ``iluvatar.ai/{type}-vgpu`` (devices), ``iluvatar.ai/{type}.vMem``
(units of 256 MiB per device; absent: the whole device) and ``iluvatar.ai/{type}.vCore``
(percent of each device; absent: no core share). Several devices are whole devices: Go's
webhook writes ``vCore`` = 100 x the count (the resource holds the cores of all of them) and
its scheduler gives each device 100 %. The webhook also sets ``SOL_CONTINER_NAME`` (sic, Go's
spelling, which the plug-in reads) to the container's name. This project has no node agent
for Iluvatar: enabling one of these backends in a node agent fails with what to run instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from hami.backends.schedulerside import SchedulerSideBackend
from hami.core.requests import DeviceRequest, RequestError
from hami.protocol.resources import ResourceNames

MEMORY_UNIT_MIB = 256  # one vMem unit
WHOLE = 100  # percent of a device
CONTAINER_NAME_ENV = "SOL_CONTINER_NAME"  # Go's spelling, kept by its plug-in
TYPES = ("MR-V100", "MR-V50", "BI-V150", "BI-V100")  # the chips of Go's chart


def resources_of(word: str) -> ResourceNames:
    """The resource names Go's chart gives an Iluvatar type."""
    return ResourceNames(
        count=f"iluvatar.ai/{word}-vgpu",
        memory=f"iluvatar.ai/{word}.vMem",
        cores=f"iluvatar.ai/{word}.vCore",
        memory_unit_mib=MEMORY_UNIT_MIB,
    )


def request_rule(request: DeviceRequest, where: str, cores_name: str) -> DeviceRequest:
    """The request Go's webhook and scheduler derive: several devices are whole devices;
    one device takes at most 100 % of the cores."""
    if request.count > 1:
        return dataclasses.replace(request, cores=WHOLE)
    if request.cores > WHOLE:
        raise RequestError(
            f"{where}: {cores_name} must be between 0 and {WHOLE} for one device, "
            f"got {request.cores}"
        )
    return request


class IluvatarBackend(SchedulerSideBackend):
    """One Iluvatar type; a subclass names its ``word`` (``TYPES``)."""

    vendor = "Iluvatar"
    node_plugin = "Iluvatar's device plug-in"

    word: ClassVar[str]
    default_cores = 0  # no core share unless asked
    known_options = frozenset()
    cores_per_container = True  # vCore holds the cores of all the container's devices

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.type_word = cls.word
        cls.vendor_word = cls.word  # Go's device type in pod values is the type word
        cls.default_resources = resources_of(cls.word)
        cls.allocated_key = f"hami.io/{cls.word}-devices-allocated"
        cls.to_allocate_key = f"hami.io/{cls.word}-devices-to-allocate"

    fixed_resources = True

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
        return request_rule(request, where, self.resources.cores or "")

    def container_env(self, container: Mapping[str, Any]) -> dict[str, str]:
        """The container's name under ``SOL_CONTINER_NAME``, as Go's webhook writes it."""
        name = container.get("name")
        return {CONTAINER_NAME_ENV: name} if isinstance(name, str) and name else {}

    @property
    def plugin_does(self) -> str:  # type: ignore[override]
        return f"writes {self.register_key}"


class MR_V100(IluvatarBackend):  # Go's type word: MR-V100
    word = "MR-V100"


class MR_V50(IluvatarBackend):
    word = "MR-V50"


class BI_V150(IluvatarBackend):
    word = "BI-V150"


class BI_V100(IluvatarBackend):
    word = "BI-V100"


BACKENDS: dict[str, type[IluvatarBackend]] = {
    cls.word: cls for cls in (MR_V100, MR_V50, BI_V150, BI_V100)
}
