"""Huawei Ascend NPUs, scheduler side only, as Go HAMi 2.10 models them (issue 24).

Every Ascend type is a device type of its own, named as Go names it (``Ascend910B3``): one
class per type below, each behind an entry point of that name, all sharing ``AscendBackend``.
The node side is Huawei's / HAMi's ascend-device-plugin: it writes the JSON register value
under ``hami.io/node-register-{type}`` (one entry per chip, counting the chip's vNPUs of the
smallest template, with a ``NetworkID`` for 910 chips), heartbeats
``hami.io/node-handshake-{type}``, and reads the decision from
``hami.io/{type}-devices-to-allocate`` and ``huawei.com/{type}`` (hami.backends.ascend_rules).
This project has no Ascend node agent: enabling one of these backends in a node agent fails
with what to run instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

from hami.backends.ascend_chips import CHIPS, Chip
from hami.backends.ascend_rules import request_rule, runtime_info
from hami.backends.schedulerside import SchedulerSideBackend
from hami.core.requests import NO_ANNOTATIONS, DeviceRequest
from hami.protocol import ContainerDevice


class AscendBackend(SchedulerSideBackend):
    """One Ascend type; a subclass names its ``chip`` (``CHIPS``)."""

    vendor = "Huawei Ascend"
    node_plugin = "HAMi's ascend-device-plugin"

    chip: ClassVar[Chip]
    default_cores = 0  # no core share unless asked (the soft split)
    known_options = frozenset()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        word = cls.chip.word
        cls.type_word = word
        cls.vendor_word = word  # Go's device type in pod values is the type word
        cls.default_resources = cls.chip.resources
        cls.allocated_key = f"hami.io/{word}-devices-allocated"
        cls.to_allocate_key = f"hami.io/{word}-devices-to-allocate"

    fixed_resources = True

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

    def pod_annotations(
        self,
        containers: Sequence[Sequence[ContainerDevice]],
        index_of: Callable[[str], int],
        annotations: Mapping[str, str] = NO_ANNOTATIONS,
    ) -> dict[str, str]:
        return runtime_info(self.chip, containers, annotations)

    @property
    def plugin_does(self) -> str:  # type: ignore[override]
        return f"writes {self.register_key}"


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
