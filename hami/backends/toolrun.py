"""Running a vendor's command-line tool (``cnmon``, ``npu-smi``) for a node backend.

The tool gets a timeout and its own process group, so a hung driver call (or a wrapper
script and its children) is killed whole; every failure becomes a BackendError that names
the command and the backend option that fixes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence

from hami.backends.base import BackendError


async def run_tool(
    argv: Sequence[str],
    *,
    label: str,
    timeout: float,  # noqa: ASYNC109 (the tool's own limit, named in its error)
    timeout_option: str,
    missing: str,
    cwd: str | None = None,
) -> str:
    """``argv``'s standard output. ``label`` starts each error (the backend's word),
    ``missing`` says what the node needs when the command is not found, and
    ``timeout_option`` names the backend option that raises ``timeout``."""
    command = argv[0]
    shown = " ".join(argv)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills it all
        )
    except FileNotFoundError as exc:
        raise BackendError(f"{label}: {command!r} not found: {missing}") from exc
    except PermissionError as exc:
        raise BackendError(f"{label}: {command!r} is not executable: {exc}") from exc
    try:
        async with asyncio.timeout(timeout):
            stdout, stderr = await proc.communicate()
    except asyncio.CancelledError:
        await _kill(proc)  # the caller gave up: leave no tool process behind
        raise
    except TimeoutError:
        await _kill(proc)
        raise BackendError(
            f"{label}: '{shown}' did not finish within {timeout:g} s (a hung driver? "
            f"raise the backend option '{timeout_option}' if it is slow)"
        ) from None
    if proc.returncode != 0:
        tail = stderr.decode(errors="replace").strip()[-500:] or "(no stderr)"
        raise BackendError(f"{label}: '{shown}' exited with status {proc.returncode}: {tail}")
    return stdout.decode(errors="replace")


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its process group: also a wrapper's children
    await proc.wait()
