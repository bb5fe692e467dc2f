"""A real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler) as local processes,
and a kubelet emulator that speaks the device plugin API, for tests and the demo.

- `hami.testkit.controlplane`: `ControlPlane`, `SchedulerProcess`, `find_binaries`.
- `hami.testkit.kubelet`: `KubeletEmulator`.
- `hami.testkit.pytest_plugin`: pytest fixtures built on them.
"""

from hami.testkit.controlplane import (
    Binaries,
    ControlPlane,
    ControlPlaneError,
    SchedulerProcess,
    find_binaries,
)
from hami.testkit.kubelet import ContainerAllocation, KubeletEmulator, PluginState, PodAdmission

__all__ = [
    "Binaries",
    "ContainerAllocation",
    "ControlPlane",
    "ControlPlaneError",
    "KubeletEmulator",
    "PluginState",
    "PodAdmission",
    "SchedulerProcess",
    "find_binaries",
]
