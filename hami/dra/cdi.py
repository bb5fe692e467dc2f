"""The CDI spec that gives a container one claim's HAMi-core contract (protocol.md §6).

The container runtime applies a CDI device's ``containerEdits`` (env, mounts, device nodes)
to every container that names the id prepare returned; the edits are exactly what the
backend's ``Allocate`` answer holds for the same slices in the extender mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hami.backends.base import ContainerAllocation
from hami.dra import names

CDI_VERSION = "0.6.0"  # env, mounts and device nodes; understood by containerd and CRI-O
JSON = dict[str, Any]


def _mount(host: str, container: str, read_only: bool) -> JSON:
    return {
        "hostPath": host,
        "containerPath": container,
        "options": ["ro" if read_only else "rw", "nosuid", "nodev", "bind"],
    }


def cdi_spec(driver: str, claim_uid: str, allocation: ContainerAllocation) -> JSON:
    edits: JSON = {"env": [f"{k}={v}" for k, v in sorted(allocation.envs.items())]}
    if allocation.mounts:
        edits["mounts"] = [
            _mount(m.host_path, m.container_path, m.read_only) for m in allocation.mounts
        ]
    if allocation.devices:
        edits["deviceNodes"] = [
            {"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
            for d in allocation.devices
        ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": names.cdi_kind(driver),
        "devices": [{"name": claim_uid, "containerEdits": edits}],
    }


def spec_env(spec: JSON) -> dict[str, str]:
    """The environment a container gets from a spec (what a runtime would set)."""
    env: dict[str, str] = {}
    for device in spec.get("devices") or []:
        for item in (device.get("containerEdits") or {}).get("env") or []:
            key, _, value = str(item).partition("=")
            env[key] = value
    return env


def write_spec(cdi_dir: str, driver: str, claim_uid: str, spec: JSON) -> Path:
    """Write atomically (a runtime may read the directory at any moment)."""
    os.makedirs(cdi_dir, exist_ok=True)
    path = Path(cdi_dir) / names.cdi_spec_file(driver, claim_uid)
    fd, tmp = tempfile.mkstemp(dir=cdi_dir, prefix=".hami-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(spec, out, indent=2, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def remove_spec(cdi_dir: str, driver: str, claim_uid: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(cdi_dir) / names.cdi_spec_file(driver, claim_uid))
