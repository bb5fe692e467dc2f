"""Enumerating Ascend chips with ``npu-smi`` (the node side of hami.backends.ascend).

Only documented queries are run (hami.backends.npu_smi reads them):

    npu-smi info -m                          the chips: NPU ID, Chip ID, logic id, name
    npu-smi info -t board -i N -c C          each chip's Chip Name and Die ID (its uuid)
    npu-smi info -t health -i N -c C         each chip's Health Status (healthy when OK)
    npu-smi info -t phyid-remap -p P         for each /dev/davinci<P>: its NPU ID and Chip ID

The physical id P is what Ascend Docker Runtime reads in ``ASCEND_VISIBLE_DEVICES``
(``/dev/davinci<P>``); Huawei documents listing ``/dev/davinci*`` to find them.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from hami.backends import npu_smi, toolrun
from hami.backends.base import BackendError

_DAVINCI = re.compile(r"davinci(\d+)")


@dataclass(frozen=True, slots=True)
class FoundChip:
    """One NPU chip with what the node side needs of it."""

    uuid: str
    logic: int
    phy: int
    name: str  # the board query's Chip Name ("910B3"): what the chart's chip_name matches
    healthy: bool


class NpuSmi:
    """Runs ``npu-smi`` (``command``) with a timeout, killing its process group on expiry."""

    def __init__(self, command: str, timeout: float, dev_dir: str) -> None:
        self.command = command
        self.timeout = timeout
        self.dev_dir = dev_dir

    async def run(self, *args: str) -> str:
        return await toolrun.run_tool(
            (self.command, *args),
            label="ascend",
            timeout=self.timeout,
            timeout_option="npu_smi_timeout",
            missing="the node needs Huawei's NPU driver and npu-smi visible to the node agent "
            "(on its PATH, or set the backend option 'npu_smi' to its path)",
        )

    async def query(self, *args: str) -> dict[str, str]:
        text = await self.run(*args)
        try:
            return npu_smi.parse_fields(text)
        except npu_smi.NpuSmiError as exc:
            raise _unreadable(args, text, exc) from exc

    async def chips(self) -> list[FoundChip]:
        """Every usable NPU chip of the node, in logic-id order."""
        text = await self.run("info", "-m")
        try:
            refs = npu_smi.parse_mapping(text)
        except npu_smi.NpuSmiError as exc:
            raise _unreadable(("info", "-m"), text, exc) from exc
        phys = await self._physical_ids()
        return list(await asyncio.gather(*(self._chip(ref, phys) for ref in refs)))

    async def _physical_ids(self) -> dict[tuple[int, int], int]:
        """(NPU ID, Chip ID) -> physical id, from each /dev/davinci<P>."""
        try:
            names = await asyncio.to_thread(os.listdir, self.dev_dir)
        except OSError as exc:
            raise BackendError(
                f"ascend: cannot list {self.dev_dir} for the davinci devices ({exc}); mount "
                f"the host's /dev into the node agent or set the backend option 'dev_dir'"
            ) from exc
        found = sorted(int(m.group(1)) for n in names if (m := _DAVINCI.fullmatch(n)))
        answers = await asyncio.gather(
            *(self.query("info", "-t", "phyid-remap", "-p", str(p)) for p in found)
        )
        out: dict[tuple[int, int], int] = {}
        for phy, fields in zip(found, answers, strict=True):
            try:
                key = (npu_smi.int_field(fields, "NPU ID"), npu_smi.int_field(fields, "Chip ID"))
            except npu_smi.NpuSmiError as exc:
                raise BackendError(
                    f"ascend: 'npu-smi info -t phyid-remap -p {phy}': {exc}"
                ) from exc
            out[key] = phy
        return out

    async def _chip(self, ref: npu_smi.ChipRef, phys: dict[tuple[int, int], int]) -> FoundChip:
        where = ("-i", str(ref.npu), "-c", str(ref.chip))
        board, health = await asyncio.gather(
            self.query("info", "-t", "board", *where), self.query("info", "-t", "health", *where)
        )
        try:
            uuid = npu_smi.die_uuid(npu_smi.field(board, "Die ID"))
            name = npu_smi.field(board, "Chip Name")
            status = npu_smi.field(health, "Health Status")
        except npu_smi.NpuSmiError as exc:
            raise BackendError(f"ascend: NPU {ref.npu} chip {ref.chip}: {exc}") from exc
        phy = phys.get((ref.npu, ref.chip))
        if phy is None:
            raise BackendError(
                f"ascend: NPU {ref.npu} chip {ref.chip} has no /dev/davinci<id> in "
                f"{self.dev_dir} (physical ids found: {sorted(phys.values()) or 'none'}); "
                f"mount the host's /dev into the node agent or set the backend option 'dev_dir'"
            )
        return FoundChip(uuid, ref.logic, phy, name, status == npu_smi.HEALTHY)


def _unreadable(args: Sequence[str], text: str, exc: Exception) -> BackendError:
    snippet = text.strip()[:200] or "(empty)"
    return BackendError(
        f"ascend: cannot read 'npu-smi {' '.join(args)}' output ({exc}); it starts with: {snippet}"
    )
