"""``hami demo``: the placement table has every sample pod on a node, and the pod that cannot
fit shows the scheduler's reason."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from hami import cli
from hami.demo.cli import UNFIT, run_demo, samples
from hami.testkit.controlplane import ControlPlane


async def test_demo_prints_where_every_sample_landed(controlplane: ControlPlane) -> None:
    out = io.StringIO()
    assert await run_demo(out, plane=controlplane, timeout=60) == 0
    text = out.getvalue()
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["POD", "REQUEST"])
    rows: dict[str, list[str]] = {}
    for line in lines[header + 1 :]:
        if not line.strip():
            break
        pod = line.split()[0].split("/")[0]
        rows.setdefault(pod, []).append(line)
    names = [s.name for s in samples()]
    assert sorted(rows) == sorted(names)
    nodes = {"gpu-a100", "gpu-v100", "gpu-t4"}
    for name in names:
        if name == UNFIT:
            continue
        for line in rows[name]:
            assert line.rstrip().endswith("Running"), line
            assert set(line.split()) & nodes, line
            assert re.search(r"\bGPU-\w+-\d-\d\b", line), line
    # a whole A100 and a pod with an init container, each shown on their device
    assert "40960" in rows["train-a100"][0] and "A100" in rows["train-a100"][0]
    assert len(rows["with-init"]) == 2 and "(init)" in rows["with-init"][0]
    assert len(rows["multi-gpu"]) == 2
    assert rows[UNFIT][0].rstrip().endswith("Pending")
    reason = next(line for line in lines if line.startswith(f"{UNFIT} is Pending:"))
    assert "0/3 nodes are available" in reason and "CardInsufficientMemory" in reason
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
