"""Invariants over a LocalCluster's pods, shared by the end-to-end and fault tests.

Two independent views of what the devices hold: the pods' ``*-devices-allocated``
annotations (what the scheduler decided) and the kubelet emulators' record of the
``Allocate`` answers (what containers were really given). Neither may exceed a device.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

from hami.testkit.cluster import LocalCluster, phase_of, pod_devices

Hold = list[int]  # [slots, memory MiB, cores %]


def container_names(pod: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """(name, is init container) in the order of device entries."""
    spec = pod["spec"]
    return [(c["name"], True) for c in spec.get("initContainers") or []] + [
        (c["name"], False) for c in spec["containers"]
    ]


def holds(pods: Mapping[str, Mapping[str, Any]]) -> dict[str, Hold]:
    """uuid -> [slots, memory, cores] summed over the pods' allocated annotations (a pod's
    hold per device: the larger of its init peak and its app containers' sum)."""
    total: dict[str, Hold] = collections.defaultdict(lambda: [0, 0, 0])
    for pod in pods.values():
        init = {c["name"] for c in pod["spec"].get("initContainers") or []}
        names = [n for n, _ in container_names(pod)]
        app: dict[str, Hold] = collections.defaultdict(lambda: [0, 0, 0])
        peak: dict[str, Hold] = collections.defaultdict(lambda: [0, 0, 0])
        for cname, devices in zip(names, pod_devices(pod), strict=True):
            for d in devices:
                if cname in init:
                    p = peak[d.uuid]
                    p[:] = [max(p[0], 1), max(p[1], d.memory), max(p[2], d.cores)]
                else:
                    a = app[d.uuid]
                    a[:] = [a[0] + 1, a[1] + d.memory, a[2] + d.cores]
        for uuid in set(app) | set(peak):
            hold = [max(x, y) for x, y in zip(app[uuid], peak[uuid], strict=True)]
            total[uuid] = [t + h for t, h in zip(total[uuid], hold, strict=True)]
    return dict(total)


def registered_devices(cluster: LocalCluster) -> dict[str, tuple[int, int, int]]:
    """uuid -> (split count, memory, cores) as the scheduler read the registers."""
    return {u: d for devices in cluster.registered().values() for u, d in devices.items()}


def assert_within_devices(
    registered: Mapping[str, tuple[int, int, int]], per_device: Mapping[str, Hold], what: str
) -> None:
    for uuid, (slots, memory, cores) in per_device.items():
        assert uuid in registered, f"{what}: {uuid} is no registered device"
        count, total_memory, total_cores = registered[uuid]
        assert slots <= count, (what, uuid, slots, count)
        assert memory <= total_memory, (what, uuid, memory, total_memory)
        assert cores <= total_cores, (what, uuid, cores, total_cores)


def assert_not_overcommitted(cluster: LocalCluster, pods: Mapping[str, Mapping[str, Any]]) -> None:
    """The decisions of the given pods fit their devices."""
    assert_within_devices(registered_devices(cluster), holds(pods), "annotations")


def answered_holds(cluster: LocalCluster) -> dict[str, Hold]:
    """uuid -> [containers, memory, cores] summed over the Allocate answers of every pod
    the kubelet emulators run now (HAMi-core env: NVIDIA_VISIBLE_DEVICES,
    CUDA_DEVICE_MEMORY_LIMIT_i, CUDA_DEVICE_SM_LIMIT)."""
    total: dict[str, Hold] = collections.defaultdict(lambda: [0, 0, 0])
    for node in cluster.nodes.values():
        if node.kubelet is None:
            continue
        for admission in node.kubelet.admissions.values():
            if admission.phase != "Running" or admission.deleted:
                continue
            for call in admission.containers:
                env = dict(call.response.envs)
                uuids = [u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u]
                cores = int(env.get("CUDA_DEVICE_SM_LIMIT", "0") or 0)
                for i, uuid in enumerate(uuids):
                    memory = env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"]
                    assert memory.endswith("m"), memory
                    hold = total[uuid]
                    hold[0] += 1
                    hold[1] += int(memory[:-1])
                    hold[2] += cores
    return dict(total)


def assert_answers_within_devices(cluster: LocalCluster) -> None:
    """What containers were given (app containers only here: the fault tests use pods
    without init containers) fits the devices."""
    assert_within_devices(registered_devices(cluster), answered_holds(cluster), "Allocate")


def running(pods: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {name: pod for name, pod in pods.items() if phase_of(pod) == "Running"}
