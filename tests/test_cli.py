"""The CLI as a user runs it: version, devices with the fake backend, error exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hami import __version__, cli
from hami.protocol import decode_node_devices

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "config" / "examples" / "fake-node.yaml"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"hami {__version__}"


def test_devices_prints_table_and_exact_annotations(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["devices", "--backend", "fake", "--config", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "GPU-fake-node-a-2  NVIDIA-Tesla T4" in out
    lines = {
        line.split(": ", 1)[0].strip(): line.split(": ", 1)[1]
        for line in out.splitlines()
        if line.startswith("  hami.io/")
    }
    assert lines["hami.io/node-handshake-nvidia"].startswith("Reported_")
    devices = decode_node_devices(lines["hami.io/node-nvidia-register"])
    assert [(d.uuid, d.memory, d.numa, d.count) for d in devices] == [
        ("GPU-fake-node-a-0", 40960, 0, 10),
        ("GPU-fake-node-a-1", 40960, 0, 10),
        ("GPU-fake-node-a-2", 15360, 1, 10),
        ("GPU-fake-node-a-3", 15360, 1, 10),
    ]


def test_unknown_backend_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["devices", "--backend", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert "unknown backend 'nosuch'" in err and "fake" in err


def test_broken_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("node:\n  register_period: never\n")
    assert cli.main(["devices", "--config", str(bad)]) == 2
    assert "node.register_period" in capsys.readouterr().err


def test_python_dash_m_entry_point() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hami", "version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout.startswith("hami ")
