"""NVIDIA MPS on a node in ``operating_mode: mps`` (issue 23 item 4; docs/node.md "MPS").

Two parts:

- :class:`MpsDaemon` runs or attaches to the node's MPS control daemon
  (``nvidia-cuda-mps-control``) at the configured pipe and log directories. ``ensure()``
  asks the daemon for its server list; when nothing answers it starts one with ``-d``
  (``daemon: start``, the default) or reports it missing (``daemon: attach``: another
  component runs it). ``stop()`` sends ``quit`` only to a daemon this object started. Every
  call runs the control program as a subprocess, so tests put a stand-in on the path.
- :func:`mps_allocation` is the answer to kubelet for one container: the GPUs by UUID, the
  pipe directory (environment and mount), the active thread percentage from the container's
  cores and the pinned device memory limit from each device's memory, and nothing of
  HAMi-core. Pure.

MPS applies a client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` only as a further restriction of the daemon's own
defaults; both are in the container's environment, which the container can change. What is
and is not enforced is in docs/node.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from hami.backends.base import AllocationRequest, BackendError, ContainerAllocation, Mount
from hami.backends.hamicore import task_priority

log = structlog.get_logger(__name__)

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
PRIORITY_ENV = "CUDA_MPS_CLIENT_PRIORITY"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
START, ATTACH = "start", "attach"
_KEYS = ("pipe_dir", "log_dir", "shm_dir", "control", "daemon", "start_timeout_s")
# How long one query of the daemon may take; a daemon that does not answer in it is down.
_QUERY_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class MpsSettings:
    """The nvidia backend's ``mps`` option. Paths are host paths, and the same inside the
    agent's container (the DaemonSet mounts them at the same place)."""

    pipe_dir: str = "/run/nvidia/mps/pipe"  # CUDA_MPS_PIPE_DIRECTORY: daemon and clients
    log_dir: str = "/run/nvidia/mps/log"  # CUDA_MPS_LOG_DIRECTORY: daemon only
    shm_dir: str = ""  # a host tmpfs mounted as the clients' /dev/shm; empty: none
    control: str = "nvidia-cuda-mps-control"  # the control program (looked up on PATH)
    daemon: str = START  # start: start one when none answers; attach: never start one
    start_timeout_s: float = 10.0  # how long a started daemon has to answer

    @classmethod
    def from_option(cls, value: Any) -> MpsSettings:
        """Read and check the ``mps`` option (None or absent: the defaults)."""
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise BackendError(
                f"nvidia: option 'mps' must be a mapping of {', '.join(_KEYS)}, got {value!r}"
            )
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise BackendError(f"nvidia: unknown mps option(s) {unknown}; known: {list(_KEYS)}")
        given: dict[str, Any] = {}
        for key in ("pipe_dir", "log_dir", "shm_dir", "control"):
            if key in value:
                text = value[key]
                if not isinstance(text, str) or "\0" in text or "," in text:
                    raise BackendError(
                        f"nvidia: mps option {key!r} must be a path without ',' or NUL, "
                        f"got {text!r}"
                    )
                given[key] = text
        for key in ("pipe_dir", "log_dir", "shm_dir"):
            path = given.get(key)
            if path and not os.path.isabs(path):
                raise BackendError(f"nvidia: mps option {key!r} must be absolute, got {path!r}")
        for key in ("pipe_dir", "log_dir", "control"):
            if given.get(key) == "":
                raise BackendError(f"nvidia: mps option {key!r} must not be empty")
        if "daemon" in value:
            if value["daemon"] not in (START, ATTACH):
                raise BackendError(
                    f"nvidia: mps option 'daemon' must be {START} (run the control daemon "
                    f"when none answers) or {ATTACH} (use one another component runs), "
                    f"got {value['daemon']!r}"
                )
            given["daemon"] = value["daemon"]
        if "start_timeout_s" in value:
            timeout = value["start_timeout_s"]
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
                raise BackendError(
                    f"nvidia: mps option 'start_timeout_s' must be a number > 0, got {timeout!r}"
                )
            given["start_timeout_s"] = float(timeout)
        return cls(**given)


class MpsDaemon:
    """The node's MPS control daemon: started here, or another's attached to. Blocking
    (subprocesses): the backend calls it from worker threads."""

    def __init__(self, settings: MpsSettings) -> None:
        self.settings = settings
        self.started = False  # this object started the daemon now running (it stops it)
        self.closed = False  # stopped: an enumeration still in flight starts nothing
        self._lock = threading.Lock()
        self._reported: str | None = None  # the last problem logged, said once per change

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[PIPE_ENV] = self.settings.pipe_dir
        env[LOG_ENV] = self.settings.log_dir
        return env

    def _control(self) -> str:
        found = shutil.which(self.settings.control)
        if found is None:
            raise BackendError(
                f"the MPS control program {self.settings.control!r} is not on the agent's "
                "PATH: give the agent container the driver's compute utilities "
                "(NVIDIA_DRIVER_CAPABILITIES=compute,utility) or set mps.control"
            )
        return found

    def _query(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self._control()],
            input=f"{command}\n",
            capture_output=True,
            text=True,
            env=self._env(),
            timeout=_QUERY_TIMEOUT_S,
            check=False,
        )

    def check(self) -> str | None:
        """None when the daemon answers at the pipe directory, else why not."""
        try:
            done = self._query("get_server_list")
        except BackendError as exc:
            return str(exc)
        except subprocess.TimeoutExpired:
            return f"the MPS control daemon at {self.settings.pipe_dir} did not answer in time"
        except OSError as exc:
            return f"the MPS control program could not run: {exc}"
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip().splitlines()
            detail = f": {said[-1][:200]}" if said else ""
            return (
                f"no MPS control daemon answers at {self.settings.pipe_dir} "
                f"(exit {done.returncode}{detail})"
            )
        return None

    def ensure(self) -> str | None:
        """Make sure a daemon answers, starting one if allowed; None when one does, else why
        not (logged once per change). Never raises for a daemon problem."""
        with self._lock:
            if self.closed:
                return "the agent is stopping"
            problem = self.check()
            if problem is not None and self.settings.daemon == START:
                problem = self._start(problem)
            elif problem is None and self._reported is None and not self.started:
                log.info("nvidia.mps_daemon_attached", pipe_dir=self.settings.pipe_dir)
            if problem != self._reported:
                if problem is None:
                    log.info("nvidia.mps_daemon_ready", pipe_dir=self.settings.pipe_dir)
                else:
                    log.warning(
                        "nvidia.mps_daemon_unavailable",
                        pipe_dir=self.settings.pipe_dir,
                        problem=problem,
                        hint="the GPUs are reported unhealthy and Allocate refuses pods until "
                        "the daemon answers"
                        + (
                            "; daemon: attach, so whatever runs it must start it"
                            if self.settings.daemon == ATTACH
                            else ""
                        ),
                    )
                self._reported = problem
            return problem

    def _start(self, why: str) -> str | None:
        self.started = False
        try:
            control = self._control()
            os.makedirs(self.settings.pipe_dir, exist_ok=True)
            os.makedirs(self.settings.log_dir, exist_ok=True)
            # -d forks the daemon and returns; its output goes to the log directory
            done = subprocess.run(
                [control, "-d"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=self._env(),
                timeout=self.settings.start_timeout_s,
                start_new_session=True,
                check=False,
            )
        except BackendError as exc:
            return str(exc)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"starting the MPS control daemon failed: {exc}"
        if done.returncode != 0:
            return (
                f"nvidia-cuda-mps-control -d exited {done.returncode} (its log: "
                f"{self.settings.log_dir}/control.log)"
            )
        deadline = time.monotonic() + self.settings.start_timeout_s
        problem: str | None = why
        while time.monotonic() < deadline:
            problem = self.check()
            if problem is None:
                self.started = True
                log.info("nvidia.mps_daemon_started", pipe_dir=self.settings.pipe_dir, was=why)
                return None
            time.sleep(0.1)
        return f"a started MPS control daemon did not answer within the start timeout: {problem}"

    def stop(self) -> None:
        """Quit the daemon if this object started it; another's is left running."""
        with self._lock:
            self.closed = True
            if not self.started:
                return
            self.started = False
            try:
                done = self._query("quit")
            except (BackendError, OSError, subprocess.TimeoutExpired) as exc:
                log.warning("nvidia.mps_daemon_stop_failed", error=str(exc))
                return
            if done.returncode != 0:
                log.warning(
                    "nvidia.mps_daemon_stop_failed",
                    error=(done.stdout + done.stderr).strip()[:200],
                )
                return
            log.info("nvidia.mps_daemon_stopped", pipe_dir=self.settings.pipe_dir)


def pinned_limit(request: AllocationRequest) -> str | None:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``<ordinal>=<MiB>M`` per device with a memory
    limit, the ordinal being the device's place in the container (CUDA's numbering there);
    None when no device has one."""
    parts = [f"{i}={d.memory}M" for i, d in enumerate(request.devices) if d.memory > 0]
    return ",".join(parts) or None


def mps_allocation(
    request: AllocationRequest, settings: MpsSettings, *, priority_resource: str | None = None
) -> ContainerAllocation:
    """The answer for one container on an MPS node. Pure; raises BackendError."""
    devices = list(request.devices)
    if not devices:
        raise BackendError(
            f"pod {request.pod_namespace}/{request.pod_name} container "
            f"{request.container_name}: no devices to allocate"
        )
    envs = {
        VISIBLE_DEVICES: ",".join(d.uuid for d in devices),
        PIPE_ENV: settings.pipe_dir,
    }
    # One percentage per client: the container's cores, as HAMi-core's CUDA_DEVICE_SM_LIMIT
    # takes them from its first device. 0 asks for no share of the cores: no limit.
    cores = devices[0].cores
    if cores > 0:
        envs[THREADS_ENV] = str(min(cores, 100))
    pinned = pinned_limit(request)
    if pinned is not None:
        envs[PINNED_ENV] = pinned
    priority = task_priority(request, priority_resource)
    if priority is not None:
        # HAMi's 0 (high) is MPS's normal priority, anything lower is MPS's below normal
        envs[PRIORITY_ENV] = "0" if priority == "0" else "1"
    mounts = [Mount(settings.pipe_dir, settings.pipe_dir)]
    if settings.shm_dir:
        mounts.append(Mount(settings.shm_dir, "/dev/shm"))
    return ContainerAllocation(envs=envs, mounts=mounts)
