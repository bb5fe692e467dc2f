"""``hami demo --mode dra``: the same sample workloads as the extender mode, placed by
kube-scheduler alone, with the same HAMi-core limits per container."""

from __future__ import annotations

import io

from hami import cli
from hami.demo.cli import run_demo
from hami.demo.dra import UNFIT, samples
from hami.testkit.controlplane import ControlPlane

MODEL_MIB = {"A100-SXM4-40GB": 40960, "Tesla V100-PCIE-32GB": 32768, "Tesla T4": 15360}


def _rows(text: str) -> dict[str, list[tuple[str, int, int]]]:
    """pod -> (model, memory, cores) per device line of the placement table."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["POD", "REQUEST"])
    cols = lines[header]
    # the extender table has a SHARED AS column after the cores, the DRA one does not
    after = "SHARED AS" if "SHARED AS" in cols else "STATUS"
    starts = [cols.index(c) for c in ("MODEL", "MEMORY MiB", "CORES %", after)]
    out: dict[str, list[tuple[str, int, int]]] = {}
    for line in lines[header + 1 :]:
        if not line.strip():
            break
        pod = line.split()[0].split("/")[0]
        model = line[starts[0] : starts[1]].strip()
        memory, cores = line[starts[1] : starts[2]].strip(), line[starts[2] : starts[3]].strip()
        if memory == "-":
            out.setdefault(pod, [])
            continue
        out.setdefault(pod, []).append((model, int(memory), int(cores)))
    return out


async def test_dra_demo_gives_the_extender_modes_limits(controlplane: ControlPlane) -> None:
    dra_out, ext_out = io.StringIO(), io.StringIO()
    assert await run_demo(dra_out, plane=controlplane, timeout=60, mode="dra") == 0
    assert await run_demo(ext_out, plane=controlplane, timeout=60) == 0
    dra_text = dra_out.getvalue()
    assert "placed by kube-scheduler alone (DRA)" in dra_text
    dra, ext = _rows(dra_text), _rows(ext_out.getvalue())
    assert sorted(dra) == sorted(s.name for s in samples())
    assert dra[UNFIT] == [] and f"{UNFIT} is Pending" in dra_text
    assert "cannot allocate all claims" in dra_text
    for name, devices in dra.items():
        if name == UNFIT:
            continue
        assert devices, f"{name} has no device in the DRA table"
        if name == "infer-half":  # 50 % of whichever model it got, in both modes
            for rows in (devices, ext[name]):
                assert [(m, c) for m, _, c in rows] == [(rows[0][0], 30)]
                assert rows[0][1] == MODEL_MIB[rows[0][0]] // 2
            continue
        limits = sorted((m, c) for _, m, c in devices)
        assert limits == sorted((m, c) for _, m, c in ext[name]), name
        if name in ("train-a100", "on-v100"):  # the model selector held
            assert {m for m, _, _ in devices} == {m for m, _, _ in ext[name]}


def test_demo_mode_flag() -> None:
    args = cli.build_parser().parse_args(["demo", "--mode", "dra", "--no-build"])
    assert args.mode == "dra"
