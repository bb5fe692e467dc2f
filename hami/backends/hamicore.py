"""The HAMi-core answer for a container (protocol.md section 6), shared by NVIDIA-like backends.

HAMi-core (``libvgpu.so``, preloaded in the container) reads these variables to cap device
memory and compute; the per-container host directory holds its shared usage cache.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from hami.backends.base import AllocationRequest, BackendError, ContainerAllocation, Mount
from hami.core.requests import parse_quantity

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class HamiCorePaths:
    """Host and container paths of HAMi-core; configurable per site."""

    vgpu_dir: str = "/usr/local/vgpu"  # inside the container; holds the shared cache
    library: str = "/usr/local/vgpu/libvgpu.so"  # host and container path
    containers_dir: str = "/usr/local/vgpu/containers"  # host: one directory per container
    lock_dir: str = "/tmp/vgpulock"
    preload: str = "/usr/local/vgpu/ld.so.preload"  # host file mounted as /etc/ld.so.preload

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> HamiCorePaths:
        given = options.get("hamicore", {}) or {}
        if not isinstance(given, Mapping):
            raise BackendError("option 'hamicore' must be a mapping of path names to paths")
        unknown = set(given) - set(cls.__dataclass_fields__)
        if unknown:
            raise BackendError(
                f"unknown hamicore path option(s) {sorted(unknown)}; "
                f"known: {sorted(cls.__dataclass_fields__)}"
            )
        return cls(**{key: str(value) for key, value in given.items()})


TASK_PRIORITY_ENV = "CUDA_TASK_PRIORITY"


def hamicore_allocation(
    request: AllocationRequest,
    paths: HamiCorePaths,
    *,
    cache_token: str | None = None,
    priority_resource: str | None = None,
) -> ContainerAllocation:
    devices = list(request.devices)
    if not devices:
        raise BackendError(
            f"pod {request.pod_namespace}/{request.pod_name} container "
            f"{request.container_name}: no devices to allocate"
        )
    token = cache_token or uuid.uuid4().hex
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in devices),
        "CUDA_DEVICE_SM_LIMIT": str(devices[0].cores),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{paths.vgpu_dir}/{token}.cache",
    }
    for i, device in enumerate(devices):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.memory}m"
    priority = task_priority(request, priority_resource)
    if priority is not None:
        envs[TASK_PRIORITY_ENV] = priority
    host_dir = os.path.join(paths.containers_dir, f"{request.pod_uid}_{request.container_name}")
    mounts = [
        Mount(paths.library, paths.library, read_only=True),
        Mount(host_dir, paths.vgpu_dir),
        Mount(paths.lock_dir, paths.lock_dir),
    ]
    if request.container_env.get("CUDA_DISABLE_CONTROL", "").lower() != "true":
        mounts.append(Mount(paths.preload, "/etc/ld.so.preload", read_only=True))
    return ContainerAllocation(envs=envs, mounts=mounts, host_dirs=[host_dir])


def hamicore_admin_allocation(request: AllocationRequest) -> ContainerAllocation:
    """An admin-access claim (monitoring): the devices visible and nothing of HAMi-core.
    Without libvgpu preloaded the container is neither capped nor registered in the
    devices' shared regions, so it never counts as a tenant; without the lock directory
    it takes no part in HAMi-core's locking."""
    if not request.devices:
        raise BackendError(
            f"pod {request.pod_namespace}/{request.pod_name} container "
            f"{request.container_name}: no devices to allocate"
        )
    return ContainerAllocation(
        envs={"NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in request.devices)}
    )


def task_priority(request: AllocationRequest, resource: str | None) -> str | None:
    """The container's ``{resource}`` limit as HAMi-core's ``CUDA_TASK_PRIORITY`` (0 high,
    1 low), or None when it sets none. The scheduler admits only whole numbers >= 0; a
    value that reached us unchecked (a pod bound by another scheduler) is left out rather
    than failing the container's start."""
    if not resource or resource not in request.container_limits:
        return None
    try:
        value = parse_quantity(request.container_limits[resource])
    except ValueError as exc:
        log.warning(
            "hamicore.priority_ignored",
            pod=f"{request.pod_namespace}/{request.pod_name}",
            container=request.container_name,
            resource=resource,
            error=str(exc),
        )
        return None
    return str(max(value, 0))
