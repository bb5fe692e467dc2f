"""A stand-in ``npu-smi`` for nodes without Huawei's driver: the node-side tests and the
Ascend node of ``hami demo`` run this project's Ascend backend over it, as a subprocess.

Its answers are the documented outputs in hami/testkit/npu_smi (each file names its page)
with the values of a chosen node put in place of the page's: the layout stays the
documented one (``set_fields`` with the page's own values gives the page's text back,
which tests/test_npu_smi.py checks).
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the documented outputs, each file naming its page
FIXTURES = Path(__file__).parent / "npu_smi"
_MAPPING_KEYS = ("NPU ID", "Chip ID", "Chip Logic ID", "Chip Name")


def fixture(name: str) -> str:
    """A fixture's documented text, without its source header."""
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("#"))


@dataclass(frozen=True)
class FakeChip:
    npu: int
    chip: int
    logic: int
    phy: int
    name: str  # the board query's Chip Name: 910B3
    die: str  # the Die ID value: V1,010A88C4 00A1A210 00000000 00000000 00180000
    health: str = "OK"

    @property
    def uuid(self) -> str:
        return "-".join(self.die.split(",", 1)[1].split())


def set_fields(text: str, values: dict[str, Any]) -> str:
    """``text`` (a documented ``Key : value`` output) with the values of ``values``."""
    for key, value in values.items():
        pattern = re.compile(rf"^(\s*{re.escape(key)}\s*:\s*)\S.*$", re.MULTILINE)
        replacement = str(value).replace("\\", "\\\\")
        text, count = pattern.subn(rf"\g<1>{replacement}", text)
        if count != 1:
            raise ValueError(f"{key!r} is not a line of the documented output")
    return text


def mapping(rows: list[tuple[str, str, str, str]]) -> str:
    """``npu-smi info -m`` for ``rows``, the columns where the documented header puts them."""
    header = fixture("info_m.txt").splitlines()[0]
    starts = [header.index(key) for key in _MAPPING_KEYS]
    lines = [header]
    for row in rows:
        line = ""
        for start, value in zip(starts, row, strict=True):
            line = line.ljust(start) + value
        lines.append(line)
    return "\n".join(lines) + "\n"


def answers(chips: list[FakeChip]) -> dict[str, str]:
    """Each command line the backend runs -> what npu-smi prints for it."""
    rows: list[tuple[str, str, str, str]] = []
    for npu in sorted({c.npu for c in chips}):
        for c in sorted((c for c in chips if c.npu == npu), key=lambda c: c.chip):
            rows.append((str(c.npu), str(c.chip), str(c.logic), f"Ascend {c.name}"))
        mcu = max(c.chip for c in chips if c.npu == npu) + 1
        rows.append((str(npu), str(mcu), "-", "Mcu"))  # each board's MCU, as documented
    out = {"info -m": mapping(rows)}
    for c in chips:
        where = f"-i {c.npu} -c {c.chip}"
        out[f"info -t board {where}"] = set_fields(
            fixture("board.txt"),
            {"NPU ID": c.npu, "Chip ID": c.chip, "Chip Name": c.name, "Die ID": c.die},
        )
        out[f"info -t health {where}"] = set_fields(
            fixture("health.txt"), {"Health Status": c.health}
        )
        out[f"info -t phyid-remap -p {c.phy}"] = set_fields(
            fixture("phyid_remap.txt"),
            {
                "Chip Physical ID": c.phy,
                "Chip Logic ID": c.logic,
                "NPU ID": c.npu,
                "Chip ID": c.chip,
            },
        )
    return out


def b3_node(
    count: int = 8, *, seed: int = 0x11, unhealthy: tuple[int, ...] = (), name: str = "910B3"
) -> list[FakeChip]:
    """``count`` chips named ``name`` (910B3), one per NPU, physical ids in reverse of the
    logic ids; ``seed`` keeps the Die IDs (the UUIDs) of different nodes apart."""
    return [
        FakeChip(
            npu=i,
            chip=0,
            logic=i,
            phy=count - 1 - i,
            name=name,
            die=f"V1,{seed:02X}0A88C4 00A1A2{i:02X} 00000000 00000000 00180000",
            health="Alarm" if i in unhealthy else "OK",
        )
        for i in range(count)
    ]


def fake_npu_smi(
    where: Path,
    chips: list[FakeChip],
    mode: str = "ok",
    answers_override: dict[str, str] | None = None,
) -> tuple[Path, Path]:
    """An executable standing in for npu-smi and a dev dir with each chip's davinci<phy>;
    ``mode`` ok, fail (status 3), hang, or empty (prints nothing)."""
    data = where / "npu-smi-answers.json"
    data.write_text(json.dumps({**answers(chips), **(answers_override or {})}))
    dev = where / "dev"
    dev.mkdir(exist_ok=True)
    for name in ("davinci_manager", "devmm_svm", "hisi_hdc"):  # present on a real node
        (dev / name).touch()
    for c in chips:
        (dev / f"davinci{c.phy}").touch()
    script = where / f"npu-smi-{mode}"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""
            import json, sys, time
            mode = {mode!r}
            if mode == "hang":
                time.sleep(30)
            if mode == "fail":
                sys.stderr.write("dcmi module initialize failed. ret is -8005\\n")
                sys.exit(3)
            if mode == "empty":
                sys.exit(0)
            answers = json.load(open({str(data)!r}))
            line = " ".join(sys.argv[1:])
            if line not in answers:
                sys.stderr.write(f"Usage: npu-smi info <watch|proc|-h|-m|-l|-t type> ({{line}})\\n")
                sys.exit(1)
            sys.stdout.write(answers[line])
            """
        )
    )
    script.chmod(0o755)
    return script, dev
