"""``scripts/gpu-check.sh`` step 5: the MIG capability the NVIDIA backend reads, against
``nvidia-smi mig -lgip`` (GPU instance profiles) and ``-lgipp`` (their possible placements).

Reads only. Nothing here enables, disables or creates anything: the machines this runs on
are shared, and a MIG mode change needs a GPU reset. A GPU whose MIG mode is off, or that
has no MIG, is one SKIP line saying so.

For each profile nvidia-smi lists on a GPU in MIG mode, the backend reads it as it would for
an allow-list naming it (``read_mig_profiles``): the placements must be nvidia-smi's, and
the memory nvidia-smi's GiB (two decimals). A name chooses its NVML profile by its slice
word, as Go HAMi's plugin does (``1g.10gb`` reads as NVML's plain 1-slice profile); where
NVML names that profile differently, the row is a SKIP that says so, not a comparison.

The text formats are those NVIDIA's MIG user guide shows; ``tests/test_gpu_check_mig.py``
parses its examples.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hami.backends import _nvml
from hami.backends._nvml_mig import GI_PROFILE_BY_SLICES, read_mig_profiles
from hami.protocol.mig import AllowedMigProfiles, MigPlacement, MigProfile, profile_slice_key
from hami.testkit.gpucheck_run import Check, Runner

SMI_MIG_MODE = ("nvidia-smi", "--query-gpu=index,mig.mode.current", "--format=csv,noheader")
SMI_LGIP = ("nvidia-smi", "mig", "-lgip")
SMI_LGIPP = ("nvidia-smi", "mig", "-lgipp")
NAME = "step5 MIG"
GIB_TOLERANCE = 0.01  # nvidia-smi prints GiB with two decimals


@dataclass(frozen=True)
class SmiProfile:
    """One profile row of ``nvidia-smi mig -lgip``."""

    gpu: int
    name: str  # without "MIG "
    profile_id: int  # nvidia-smi's ID column
    free: int
    total: int
    memory_gib: float


# |   0  MIG 1g.5gb        19     7/7        4.75       No     14     0     0   |
_LGIP_ROW = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+MIG\s+(?P<name>\S+)\s+(?P<id>\d+)\s+(?P<free>\d+)/(?P<total>\d+)"
    r"\s+(?P<gib>\d+(?:\.\d+)?)\s"
)
# GPU  0 Profile ID  9 Placements: {0,4}:4     (one placement: "Placement :")
_LGIPP_ROW = re.compile(
    r"^\s*GPU\s+(?P<gpu>\d+)\s+Profile\s+ID\s+(?P<id>\d+)\s+Placements?\s*:\s*"
    r"\{(?P<starts>[\d,\s]*)\}\s*:\s*(?P<size>\d+)\s*$"
)


def parse_lgip(text: str) -> list[SmiProfile]:
    """The profile rows (each profile's second line, the CE/JPEG/OFA counts, is not one)."""
    out: list[SmiProfile] = []
    for line in text.splitlines():
        m = _LGIP_ROW.match(line.strip())
        if m:
            out.append(
                SmiProfile(
                    gpu=int(m["gpu"]),
                    name=m["name"],
                    profile_id=int(m["id"]),
                    free=int(m["free"]),
                    total=int(m["total"]),
                    memory_gib=float(m["gib"]),
                )
            )
    return out


def parse_lgipp(text: str) -> dict[tuple[int, int], tuple[MigPlacement, ...]]:
    """(GPU, profile ID) -> its possible placements. A line that names a GPU and profile but
    does not read raises ValueError (a format this parser does not know)."""
    out: dict[tuple[int, int], tuple[MigPlacement, ...]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LGIPP_ROW.match(line)
        if m is None:
            if re.match(r"^\s*GPU\s+\d+\s+Profile", line):
                raise ValueError(f"nvidia-smi mig -lgipp line not understood: {line.strip()!r}")
            continue
        starts = [int(s) for s in m["starts"].replace(" ", "").split(",") if s]
        size = int(m["size"])
        out[(int(m["gpu"]), int(m["id"]))] = tuple(MigPlacement(s, size) for s in starts)
    return out


def parse_mig_modes(text: str) -> dict[int, str]:
    """``index, mig.mode.current`` rows: GPU index -> ``Enabled``, ``Disabled`` or
    ``[N/A]`` (no MIG)."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        index, _, mode = line.partition(",")
        if index.strip().isdigit():
            out[int(index)] = mode.strip()
    return out


def _placements(placements: Sequence[MigPlacement]) -> str:
    sizes = sorted({p.size for p in placements})
    return "; ".join(
        "{" + ",".join(str(p.start) for p in placements if p.size == s) + f"}}:{s}" for s in sizes
    )


def _nvml_name(nvml: Any, handle: Any, word: str) -> str | None:
    """The name NVML gives the profile a slice word picks (None when it gives none)."""
    profile_id = GI_PROFILE_BY_SLICES.get(word)
    if profile_id is None:
        return None
    try:
        info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
    except nvml.NVMLError:
        return None
    name = getattr(info, "name", None)
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return str(name).removeprefix("MIG ").strip() if name else None


def compare_profile(
    row: SmiProfile,
    placements: tuple[MigPlacement, ...] | None,
    read: MigProfile | None,
    why_not: str,
    nvml_name: str | None,
) -> Check:
    """One nvidia-smi profile against what the backend reads for that name."""
    name = f"{NAME} GPU{row.gpu} {row.name}"
    if nvml_name is not None and nvml_name != row.name:
        return Check(
            name,
            "SKIP",
            f"the agent reads {row.name} as NVML's {nvml_name} (a name picks its profile by "
            f"the slice word, as Go HAMi does): allow-list {nvml_name} instead",
        )
    if read is None:
        return Check(name, "FAIL", f"nvidia-smi lists it, the agent cannot read it ({why_not})")
    if placements is None:
        return Check(
            name, "FAIL", f"nvidia-smi mig -lgipp lists no placements for ID {row.profile_id}"
        )
    wrong = []
    if sorted(read.placements, key=lambda p: (p.size, p.start)) != sorted(
        placements, key=lambda p: (p.size, p.start)
    ):
        wrong.append(
            f"placements: agent {_placements(read.placements)}, "
            f"nvidia-smi {_placements(placements)}"
        )
    gib = read.memory_mb / 1024
    if abs(gib - row.memory_gib) > GIB_TOLERANCE:
        wrong.append(
            f"memory: agent {read.memory_mb} MiB ({gib:.2f} GiB), nvidia-smi {row.memory_gib} GiB"
        )
    if wrong:
        return Check(name, "FAIL", "; ".join(wrong))
    return Check(
        name,
        "PASS",
        f"placements {_placements(placements)}, {read.memory_mb} MiB, {read.slice_count} "
        f"compute slice(s), as nvidia-smi (ID {row.profile_id})",
    )


def _read(nvml: Any, index: int, name: str) -> tuple[Any, str, MigProfile | None, str]:
    """(handle, model, the backend's reading of ``name``, why none)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    model = _nvml.model_name(_nvml.text(nvml.nvmlDeviceGetName(handle)))
    allowed = (AllowedMigProfiles((model,), (name,)),)
    profiles, _, skipped = read_mig_profiles(nvml, handle, model, allowed)
    return handle, model, (profiles[0] if profiles else None), "; ".join(skipped) or "none read"


def step5_mig(nvml: Any, run: Runner) -> list[Check]:
    """Compare every MIG-enabled GPU's profiles; SKIP lines where MIG is off or absent.
    ``nvml``: the started NVML module. Reads only."""
    ran = run(SMI_MIG_MODE)
    if not ran.ok:
        return [Check(NAME, "SKIP", f"cannot read the MIG mode ({ran.why()})")]
    modes = parse_mig_modes(ran.stdout)
    enabled = sorted(i for i, m in modes.items() if m == "Enabled")
    if not enabled:
        said = ", ".join(
            f"GPU{i} {'no MIG' if m.startswith('[') else 'MIG ' + m.lower()}"
            for i, m in sorted(modes.items())
        )
        return [
            Check(
                NAME,
                "SKIP",
                f"no GPU in MIG mode ({said}); this check only reads, it never changes MIG mode",
            )
        ]
    checks: list[Check] = []
    lgip, lgipp = run(SMI_LGIP), run(SMI_LGIPP)
    for what in (lgip, lgipp):
        if not what.ok:
            return [Check(NAME, "FAIL", f"MIG is on but {what.why()}")]
    try:
        rows = parse_lgip(lgip.stdout)
        places = parse_lgipp(lgipp.stdout)
    except ValueError as exc:
        return [Check(NAME, "FAIL", str(exc))]
    for index in enabled:
        mine = [r for r in rows if r.gpu == index]
        if not mine:
            checks.append(
                Check(f"{NAME} GPU{index}", "FAIL", "nvidia-smi mig -lgip lists no profile")
            )
            continue
        for row in mine:
            try:
                handle, _, read, why = _read(nvml, index, row.name)
            except nvml.NVMLError as exc:
                checks.append(Check(f"{NAME} GPU{index} {row.name}", "FAIL", f"NVML: {exc}"))
                continue
            word = profile_slice_key(row.name)
            checks.append(
                compare_profile(
                    row,
                    places.get((index, row.profile_id)),
                    read,
                    why,
                    _nvml_name(nvml, handle, word),
                )
            )
    return checks


def step5(nvml: Any, run: Runner) -> list[Check]:
    """``step5_mig`` with NVML started and shut down around it (``nvml``: None for the real
    pynvml; tests pass a fake). Blocks: run it in a worker thread."""
    module = nvml if nvml is not None else importlib.import_module("pynvml")
    module.nvmlInit()
    try:
        return step5_mig(module, run)
    finally:
        module.nvmlShutdown()
