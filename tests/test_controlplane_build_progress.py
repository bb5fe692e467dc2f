"""``make controlplane`` (tests/controlplane/build.sh) says it is alive while go build runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parent / "controlplane" / "build.sh"


def _run_with_fake_go(tmp_path: Path, go_body: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(f"#!/bin/sh\n{go_body}\n")
    go.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HAMI_CONTROLPLANE_DIR": str(tmp_path / "cache"),
        "HAMI_BUILD_TICK": "1",
    }
    return subprocess.run(["bash", str(BUILD)], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("status", [0, 3])
def test_a_slow_build_prints_progress_and_keeps_go_build_status(
    tmp_path: Path, status: int
) -> None:
    done = _run_with_fake_go(tmp_path, f"sleep 3.5\nexit {status}")
    ticks = [line for line in done.stderr.splitlines() if "still building" in line]
    assert len(ticks) >= 2, done.stderr
    assert "kube-apiserver" in ticks[0]
    assert done.returncode == status
