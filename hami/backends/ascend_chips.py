"""The Huawei Ascend NPU types Go HAMi 2.10 schedules, with the defaults of its Helm chart's
device ConfigMap (``vnpus.configs`` of charts/hami at the commit docs/interop.md names).

Each type is one device type of its own (Go's ``commonWord``): its register key, pod keys and
resource names all carry the type word. Memory is in MiB. A container's memory is rounded up
to the smallest vNPU template that holds it (``trim_memory``); a request above every template
but within the chip's capacity takes the whole chip's allocatable memory. Facts only: the
numbers are the chart's.
"""

from __future__ import annotations

from dataclasses import dataclass

from hami.protocol.resources import ResourceNames


@dataclass(frozen=True, slots=True)
class Template:
    """A vNPU template: its name as Huawei's tools know it, and its memory (MiB)."""

    name: str
    memory: int


@dataclass(frozen=True, slots=True)
class Chip:
    """One Ascend device type as Go HAMi's chart configures it."""

    word: str  # Go's commonWord: Ascend910B3
    chip_name: str  # the name the node's plug-in matches (npu-smi's chip name)
    memory_allocatable: int  # MiB a whole chip gives
    memory_capacity: int  # MiB above which a request is refused
    ai_core: int
    templates: tuple[Template, ...]  # ordered by memory, smallest first
    super_pod: bool = False  # allocated by 2-NPU module (Ascend 910C)

    @property
    def resources(self) -> ResourceNames:
        return ResourceNames(
            count=f"huawei.com/{self.word}",
            memory=f"huawei.com/{self.word}-memory",
            cores=f"huawei.com/{self.word}-core",
        )

    @property
    def slots(self) -> int:
        """How many vNPUs of the smallest template a chip holds (the count the node's
        plug-in registers for each chip)."""
        if not self.templates:
            return 1
        return self.memory_allocatable // self.templates[0].memory


def trim_memory(chip: Chip, memory: int) -> tuple[int, str]:
    """``memory`` MiB rounded up to the smallest template that holds it, with the template's
    name; the chip's allocatable memory (no name) above every template but within the
    capacity; (0, "") above the capacity: no vNPU can serve it."""
    for template in chip.templates:
        if memory <= template.memory:
            return template.memory, template.name
    if memory <= chip.memory_capacity:
        return chip.memory_allocatable, ""
    return 0, ""


def _chip(
    word: str,
    chip_name: str,
    memory: int,
    ai_core: int,
    templates: tuple[tuple[str, int], ...],
    *,
    capacity: int | None = None,
    super_pod: bool = False,
) -> Chip:
    ordered = tuple(sorted((Template(n, m) for n, m in templates), key=lambda t: t.memory))
    return Chip(
        word,
        chip_name,
        memory,
        memory if capacity is None else capacity,
        ai_core,
        ordered,
        super_pod,
    )


CHIPS: dict[str, Chip] = {
    chip.word: chip
    for chip in (
        _chip(
            "Ascend910A",
            "910A",
            32768,
            30,
            (("vir02", 2184), ("vir04", 4369), ("vir08", 8738), ("vir16", 17476)),
        ),
        _chip(
            "Ascend910B2",
            "910B2",
            65536,
            24,
            (("vir03_1c_8g", 8192), ("vir06_1c_16g", 16384), ("vir12_3c_32g", 32768)),
        ),
        _chip(
            "Ascend910B3",
            "910B3",
            65536,
            20,
            (("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768)),
        ),
        _chip(
            "Ascend910B4-1",
            "910B4-1",
            65536,
            20,
            (("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768)),
        ),
        _chip(
            "Ascend910B4",
            "910B4",
            32768,
            20,
            (("vir05_1c_8g", 8192), ("vir10_3c_16g", 16384)),
        ),
        _chip(
            "Ascend310P",
            "310P3",
            21527,
            8,
            (("vir01", 3072), ("vir02", 6144), ("vir04", 12288)),
            capacity=24576,
        ),
        _chip(
            "Ascend910C",
            "Ascend910",
            65536,
            20,
            (("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768)),
            super_pod=True,
        ),
    )
}
