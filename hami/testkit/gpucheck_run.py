"""The report and the command runner of ``scripts/gpu-check.sh`` (``hami.testkit.gpucheck``)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

Status = Literal["PASS", "FAIL", "SKIP"]


# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Check:
    """One line of the report: ``PASS step1 GPU0 <uuid>: <detail>``."""

    name: str
    status: Status
    detail: str

    def line(self) -> str:
        return f"{self.status} {self.name}: {self.detail}"


@dataclass
class Report:
    """Every check in the order run; any FAIL fails the whole check (exit status 1)."""

    checks: list[Check] = field(default_factory=list)

    def extend(self, checks: Sequence[Check]) -> None:
        self.checks.extend(checks)

    @property
    def failed(self) -> bool:
        return any(c.status == "FAIL" for c in self.checks)

    def summary(self) -> str:
        counts = {s: sum(1 for c in self.checks if c.status == s) for s in ("PASS", "FAIL", "SKIP")}
        verdict = "FAILED" if self.failed else "OK"
        return (
            f"gpu-check {verdict}: {counts['PASS']} passed, {counts['FAIL']} failed, "
            f"{counts['SKIP']} skipped"
        )


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Ran:
    """A finished command; returncode 127 when the program is not there."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def why(self) -> str:
        """The command's failure in one line, for a report."""
        said = (self.stderr.strip() or self.stdout.strip()).splitlines()
        tail = said[-1] if said else "no output"
        return f"`{' '.join(self.argv)}` exited {self.returncode}: {tail}"


class Runner(Protocol):
    """``run_command``'s signature; tests pass their own."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout: float = ...,
        env: Mapping[str, str] | None = ...,
        cwd: str | None = ...,
    ) -> Ran: ...


def run_command(
    argv: Sequence[str],
    *,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> Ran:
    """Run a program to its end; a missing program or a timeout is a failed ``Ran``."""
    args = tuple(argv)
    try:
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError:
        return Ran(args, 127, "", f"{args[0]}: command not found")
    except subprocess.TimeoutExpired:
        return Ran(args, 124, "", f"timed out after {timeout:g}s")
    except OSError as exc:
        return Ran(args, 126, "", f"{args[0]}: {exc}")
    return Ran(args, done.returncode, done.stdout, done.stderr)


@dataclass(frozen=True)
class Answer:
    """The Allocate answer kubelet got for the slice pod, with what the pod asked for."""

    uuid: str  # NVIDIA_VISIBLE_DEVICES
    index: int  # its NVML index (nvidia-smi's row)
    memory_mib: int
    cores: int
    envs: dict[str, str]
    mounts: dict[str, tuple[str, bool]]  # container path -> (host path, read only)
    lock_dir: str  # HAMi-core's lock directory (a mount, same path on both sides)
