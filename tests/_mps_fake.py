"""A stand-in for ``nvidia-cuda-mps-control`` that the MPS tests put on PATH (no driver
here). It behaves as the tests assume the real one does:

- ``-d`` starts a background daemon and returns 0; the daemon writes its pid to
  ``$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid`` and waits to be told to quit;
- without arguments it is a client: it reads commands from stdin and exits 1 with
  "Cannot find MPS control daemon process" when no daemon runs at the pipe directory,
  else answers them (``get_server_list``: nothing; ``quit``: the daemon ends) and exits 0.

Every call is appended to ``calls.log`` beside the script, with the pipe directory it
saw. A file ``fail-start`` beside the script makes ``-d`` exit 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """#!{python}
import os, signal, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIPE = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
PID = PIPE / "nvidia-cuda-mps-control.pid"


def record(what):
    with open(HERE / "calls.log", "a") as f:
        f.write(f"{{what}} pipe={{PIPE}} log={{os.environ.get('CUDA_MPS_LOG_DIRECTORY', '')}}\\n")


def alive():
    try:
        pid = int(PID.read_text())
        state = Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state in ("Z", "X") else pid


args = sys.argv[1:]
if args == ["-d"]:
    record("start")
    if (HERE / "fail-start").exists():
        sys.exit(1)
    subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=os.environ,
    )
    sys.exit(0)
if args == ["--serve"]:
    PIPE.mkdir(parents=True, exist_ok=True)
    PID.write_text(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(0.2)
commands = [line.strip() for line in sys.stdin if line.strip()]
record("client " + ";".join(commands))
pid = alive()
if pid is None:
    print("Cannot find MPS control daemon process")
    sys.exit(1)
for command in commands:
    if command == "quit":
        os.kill(pid, signal.SIGTERM)
        PID.unlink(missing_ok=True)
sys.exit(0)
"""


class FakeMpsControl:
    """The stand-in, installed as ``<bin>/nvidia-cuda-mps-control``."""

    def __init__(self, bin_dir: Path) -> None:
        bin_dir.mkdir(parents=True, exist_ok=True)
        self.bin_dir = bin_dir
        self.path = bin_dir / "nvidia-cuda-mps-control"
        self.path.write_text(SCRIPT.format(python=sys.executable))
        self.path.chmod(0o755)

    def calls(self) -> list[str]:
        log = self.bin_dir / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def fail_start(self, fail: bool = True) -> None:
        flag = self.bin_dir / "fail-start"
        if fail:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    @staticmethod
    def daemon_pid(pipe_dir: Path) -> int | None:
        try:
            pid = int((pipe_dir / "nvidia-cuda-mps-control.pid").read_text())
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            return None
        return None if state in ("Z", "X") else pid

    def start_elsewhere(self, pipe_dir: Path, log_dir: Path) -> int:
        """A daemon another component started (for attach tests); its pid."""
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe_dir))
        env["CUDA_MPS_LOG_DIRECTORY"] = str(log_dir)
        subprocess.run([str(self.path), "-d"], env=env, check=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pid = self.daemon_pid(pipe_dir)
            if pid is not None:
                return pid
            time.sleep(0.05)
        raise AssertionError("the fake daemon did not start")

    def kill(self, pipe_dir: Path) -> None:
        """End a daemon at ``pipe_dir`` behind the agent's back (or clean up after a test)."""
        pid = self.daemon_pid(pipe_dir)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while self.daemon_pid(pipe_dir) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
