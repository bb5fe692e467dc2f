"""The CDI spec of one claim: one device per group of its requests (hami.dra.groups), each
with the HAMi-core contract (protocol.md §6) of that group's slices.

The container runtime applies a CDI device's ``containerEdits`` (env, mounts, device nodes)
to every container that names the id prepare returned; the edits are exactly what the
backend's ``Allocate`` answer holds for the same slices in the extender mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Sequence
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


def _edits(allocation: ContainerAllocation) -> JSON:
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
    return edits


def cdi_spec(driver: str, devices: Sequence[tuple[str, ContainerAllocation]]) -> JSON:
    """The spec file of one claim: ``devices`` are (CDI device name, its edits)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": names.cdi_kind(driver),
        "devices": [
            {"name": name, "containerEdits": _edits(allocation)} for name, allocation in devices
        ],
    }


def spec_env(spec: JSON, device: str | None = None) -> dict[str, str]:
    """The environment a container gets from a spec's devices, or from its device named
    ``device`` (what a runtime would set)."""
    env: dict[str, str] = {}
    for entry in spec.get("devices") or []:
        if device is not None and entry.get("name") != device:
            continue
        for item in (entry.get("containerEdits") or {}).get("env") or []:
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
