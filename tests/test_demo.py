"""``hami demo``: the placement table has every sample pod on a node (HAMi-core pods on the
HAMi-core nodes, MIG pods on instances of the MIG node, the Ascend pod on a vNPU template
of the Ascend node, started by this project's agent), and the pod that cannot fit shows the
scheduler's reason."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import pytest

from hami import cli
from hami.demo.cli import run_demo
from hami.demo.placement import HEADER
from hami.demo.samples import UNFIT, samples
from hami.testkit.cluster import DEMO_ASCEND_NODE
from hami.testkit.controlplane import ControlPlane

MIG_PODS = ("mig-small", "mig-large")
ASCEND_POD = "npu-vnpu"


def parse_table(lines: list[str]) -> dict[str, list[dict[str, str]]]:
    """The placement table's rows by pod, each row cut into its columns at the header's
    offsets (cells hold spaces: "MIG 1g.5gb")."""
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["POD", "REQUEST"])
    header = lines[at]
    starts = [header.index(name) for name in HEADER]
    rows: dict[str, list[dict[str, str]]] = {}
    for line in lines[at + 1 :]:
        if not line.strip():
            break
        cells = {
            name: line[begin:end].strip()
            for name, begin, end in zip(HEADER, starts, [*starts[1:], None], strict=True)
        }
        rows.setdefault(cells["POD"].split("/")[0].split()[0], []).append(cells)
    return rows


async def test_demo_prints_where_every_sample_landed(controlplane: ControlPlane) -> None:
    out = io.StringIO()
    assert await run_demo(out, plane=controlplane, timeout=60) == 0
    text = out.getvalue()
    lines = text.splitlines()
    rows = parse_table(lines)
    names = [s.name for s in samples()]
    assert sorted(rows) == sorted(names)
    hami_core_nodes = {"gpu-a100", "gpu-v100", "gpu-t4"}
    for name in names:
        if name in (UNFIT, *MIG_PODS, ASCEND_POD):
            continue
        for row in rows[name]:
            assert row["STATUS"] == "Running", row
            assert row["NODE"] in hami_core_nodes, row
            assert row["SHARED AS"] == "HAMi-core", row
            assert re.fullmatch(r"GPU-\w+-[0-2]-\d", row["DEVICE"]), row
    # a whole A100 and a pod with an init container, each shown on their device
    assert rows["train-a100"][0]["MEMORY MiB"] == "40960"
    assert "A100" in rows["train-a100"][0]["MODEL"]
    assert len(rows["with-init"]) == 2 and "(init)" in rows["with-init"][0]["POD"]
    assert len(rows["multi-gpu"]) == 2

    # MIG: each pod on an instance of the smallest A100 40GB profile holding its memory,
    # made by the node (the container sees the MIG device's UUID)
    for name, profile, memory in (
        ("mig-small", "1g.5gb", "4864"),
        ("mig-large", "3g.20gb", "19968"),
    ):
        (row,) = rows[name]
        assert row["NODE"] == "gpu-a100-mig" and row["STATUS"] == "Running", row
        assert row["SHARED AS"] == f"MIG {profile}" and row["MEMORY MiB"] == memory, row
        assert row["DEVICE"].startswith("MIG-") and row["MODEL"] == "A100-SXM4-40GB", row
    assert rows["mig-small"][0]["DEVICE"] != rows["mig-large"][0]["DEVICE"]

    # Ascend: 20000 MiB is served by the 32 GiB vNPU template of one 910B3 chip, and this
    # project's agent (over the stand-in npu-smi) had kubelet start the pod; the device is
    # a chip's UUID as the agent read it from npu-smi's Die ID
    (row,) = rows[ASCEND_POD]
    assert row["NODE"] == "npu-910b3" and row["STATUS"] == "Running", row
    assert row["SHARED AS"] == "vNPU vir10_3c_32g" and row["MEMORY MiB"] == "32768", row
    assert re.fullmatch(r"[0-9A-F]{8}(-[0-9A-F]{8}){4}", row["DEVICE"]), row
    assert row["MODEL"] == "Ascend910B3", row
    assert "Ascend backend over a stand-in npu-smi" in text
    assert "is Bound" not in text

    assert rows[UNFIT][0]["STATUS"] == "Pending"
    reason = next(line for line in lines if line.startswith(f"{UNFIT} is Pending:"))
    assert "0/5 nodes are available" in reason and "CardInsufficientMemory" in reason
    assert "shutting down" in text and text.rstrip().endswith("done")


def test_demo_without_binaries_says_how_to_get_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("HAMI_CONTROLPLANE_DIR", str(tmp_path))
    for var in ("HAMI_ETCD", "HAMI_KUBE_APISERVER", "HAMI_KUBE_SCHEDULER"):
        monkeypatch.delenv(var, raising=False)
    assert cli.main(["demo", "--no-build"]) == 2
    out = capsys.readouterr().out
    assert "control plane binaries not found" in out
    assert "make controlplane" in out


async def test_demo_with_the_annotations_only_ascend_stand_in(controlplane: ControlPlane) -> None:
    """``AscendNodeSpec(agent=False)``: the Node as HAMi's ascend-device-plugin annotates it,
    with no kubelet or agent, so the pod this scheduler binds there is never started."""
    out = io.StringIO()
    stand_in = dataclasses.replace(DEMO_ASCEND_NODE, agent=False)
    assert await run_demo(out, plane=controlplane, timeout=60, ascend=(stand_in,)) == 0
    text = out.getvalue()
    (row,) = parse_table(text.splitlines())[ASCEND_POD]
    assert row["NODE"] == "npu-910b3" and row["STATUS"] == "Bound", row
    assert row["SHARED AS"] == "vNPU vir10_3c_32g", row
    assert re.fullmatch(r"npu-910b3-npu-[01]", row["DEVICE"]) and row["MODEL"] == "Ascend910B3"
    assert f"{ASCEND_POD} is Bound" in text and "a stand-in annotated as that plug-in" in text
