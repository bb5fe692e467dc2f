"""``hami demo --mode dra``: the extender demo's HAMi-core pods, submitted unchanged, turned
into claims by hami's webhook and placed by kube-scheduler alone; its MIG pods as claims
for the same profiles on the MIG node's partitions; the table has the extender demo's
columns and each row what the pod asks, read from the allocated claim; the pod that cannot
fit gets ``hami explain``'s answer for claims."""

from __future__ import annotations

import io
import re

from test_demo import parse_table

from hami import cli
from hami.demo.cli import run_demo
from hami.demo.dra import DRA_MIG_NODE, MIG_PROFILES, left_out
from hami.demo.placement import HEADER
from hami.demo.samples import UNFIT, hami_core_samples, samples
from hami.testkit.cluster import DEMO_NODES
from hami.testkit.controlplane import ControlPlane

MODEL_MIB = {"A100-SXM4-40GB": 40960, "Tesla V100-PCIE-32GB": 32768, "Tesla T4": 15360}
#: what each container of the unchanged specs asks: (row label, memory MiB, cores %); a
#: count without memory is the whole device (cores 100, as the extender webhook writes
#: it); None: 50 % of whichever model the pod got
EXPECTED: dict[str, list[tuple[str, int | None, int]]] = {
    "train-a100": [("train-a100", 40960, 100)],
    "infer-small": [("infer-small", 3000, 0)],
    "infer-half": [("infer-half", None, 30)],
    "multi-gpu": [("multi-gpu", 8000, 50), ("multi-gpu", 8000, 50)],
    "sidecars": [("sidecars/c0", 4000, 0), ("sidecars/c1", 2000, 0)],
    "with-init": [("with-init/init0 (init)", 2000, 0), ("with-init/c0", 6000, 0)],
    "on-v100": [("on-v100", 10000, 25)],
    "spread-me": [("spread-me", 2000, 0)],
}
#: the MIG pods: the extender demo's profiles, memory and cores (tests/test_demo.py)
MIG_ROWS = {"mig-small": ("1g.5gb", 4864, 15), "mig-large": ("3g.20gb", 19968, 43)}


def test_the_dra_demo_submits_the_extender_demos_pod_specs() -> None:
    extender = {s.name: s.pod for s in samples()}
    core = hami_core_samples()
    assert all(extender[s.name] == s.pod for s in core)
    here = [*(s.name for s in core), *MIG_PROFILES, *(s.name for s in left_out())]
    assert sorted(here) == sorted(extender)
    assert sorted(EXPECTED) == sorted(s.name for s in core if s.name != UNFIT)
    assert sorted(MIG_ROWS) == sorted(MIG_PROFILES)
    assert [s.name for s in left_out()] == ["npu-vnpu"]


async def test_dra_demo_prints_the_extender_table_from_claims(controlplane: ControlPlane) -> None:
    out = io.StringIO()
    assert await run_demo(out, plane=controlplane, timeout=60, mode="dra") == 0
    text = out.getvalue()
    lines = text.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["POD", "REQUEST"])
    assert re.split(r"\s{2,}", header.strip()) == HEADER  # the extender demo's columns
    rows = parse_table(lines)
    assert sorted(rows) == sorted([*EXPECTED, *MIG_ROWS, UNFIT])
    nodes = {spec.name for spec in DEMO_NODES}  # HAMi-core shares never on the MIG GPU
    for name, expected in EXPECTED.items():
        got = rows[name]
        assert [r["POD"] for r in got] == [label for label, _, _ in expected], got
        for row, (_, memory, cores) in zip(got, expected, strict=True):
            assert row["STATUS"] == "Running" and row["NODE"] in nodes, row
            assert row["SHARED AS"] == "HAMi-core", row
            assert re.fullmatch(r"GPU-\w+-[0-2]-\d", row["DEVICE"]), row
            want = MODEL_MIB[row["MODEL"]] // 2 if memory is None else memory
            assert (int(row["MEMORY MiB"]), int(row["CORES %"])) == (want, cores), row
    # the selectors held, and two GPUs are two devices
    assert rows["train-a100"][0]["MODEL"] == "A100-SXM4-40GB"
    assert rows["on-v100"][0]["MODEL"] == "Tesla V100-PCIE-32GB"
    assert len({r["DEVICE"] for r in rows["multi-gpu"]}) == 2
    # MIG: the profile's instance on the MIG node, the MIG device the container sees
    for name, (profile, memory, cores) in MIG_ROWS.items():
        (row,) = rows[name]
        assert row["NODE"] == DRA_MIG_NODE.name and row["STATUS"] == "Running", row
        assert row["SHARED AS"] == f"MIG {profile}", row
        assert (int(row["MEMORY MiB"]), int(row["CORES %"])) == (memory, cores), row
        assert row["DEVICE"].startswith("MIG-") and row["MODEL"] == "A100-SXM4-40GB", row
    assert rows["mig-small"][0]["DEVICE"] != rows["mig-large"][0]["DEVICE"]
    (unfit,) = rows[UNFIT]
    assert unfit["STATUS"] == "Pending" and unfit["NODE"] == "-"

    assert any(line.startswith("mig-small, mig-large: ") for line in lines)
    for sample in left_out():  # Ascend: said, not silently dropped
        assert any(line.startswith(f"not submitted: {sample.name} ") for line in lines)
    assert f"{UNFIT} is Pending: 0/4 nodes are available: 4 cannot allocate all claims" in text
    # hami explain for claims: the request, then every node with each device's shortfall
    found = [i for i, line in enumerate(lines) if line.startswith("hami explain (claims):")]
    assert found, f"no hami explain answer for {UNFIT}:\n{text}"
    at = found[0]
    assert re.search(r"waits on claim too-big-hami-\w+ request 'c0'", lines[at]), lines[at]
    for node in sorted(nodes):
        (line,) = [x for x in lines[at + 1 :] if x.startswith(f"  {node}: ")]
        assert re.search(r"GPU-\w+-\d-0 has \d+ MiB in all, .* asks 64000 MiB", line), line
    assert any(x.startswith(f"  {DRA_MIG_NODE.name}: ") for x in lines[at + 1 :])
    assert "shutting down" in text and text.rstrip().endswith("done")


def test_demo_mode_flag() -> None:
    args = cli.build_parser().parse_args(["demo", "--mode", "dra", "--no-build"])
    assert args.mode == "dra"
