"""Issue 10 item 5: pod values written by Go HAMi 2.10 lack the entries of containers that
ask for no device of the type (protocol.md §8). Measured end to end with Go's scheduler:
``[c0 none, c1 1500 MiB]`` was written ``X:;`` and ``[c0, c1 none, c2]`` ``X:;Y:;``. The
node agent's Allocate and the scheduler's usage map such entries, in order, onto the
containers that ask for the type (init containers first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _data import data_json
from _node_helpers import ALLOCATED, NODE, TO_ALLOC, fake_backend

from hami.backends.fake import FakeBackend
from hami.core.cluster import Cluster
from hami.core.requests import DeviceKind
from hami.core.usage import requesting
from hami.node.allocate import AllocateError, plan_allocation
from hami.protocol import decode_pod_devices, entry_containers, keys
from hami.protocol.resources import ResourceNames

GPU = "GPU-u-0"
X = f"{GPU},NVIDIA,1500,0:"
Y = f"{GPU},NVIDIA,2000,30:"
NAMES = ResourceNames("nvidia.com/gpu", "nvidia.com/gpumem", None, "nvidia.com/gpucores")


def container(name: str, mem: int | None, *, env: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {} if mem is None else {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}
    return {
        "name": name,
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
        "resources": {"limits": limits},
    }


def go_pod(
    value: str, containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "go",
            "uid": "uid-go",
            "annotations": {
                keys.BIND_PHASE: "allocating",
                keys.VGPU_NODE: NODE,
                keys.BIND_TIME: "100",
                TO_ALLOC: value,
                ALLOCATED: value,
            },
        },
        "spec": {"nodeName": NODE, "initContainers": init or [], "containers": containers},
        "status": {"phase": "Pending"},
    }


def test_the_issue_values_are_what_go_hamis_reader_reads() -> None:
    # The short values read the same in Go HAMi's own decoder (pod_devices_decode vectors):
    # one entry per container that got devices, and Go's extra empty one after the last ';'.
    cases = {c["value"]: c["go"] for c in data_json("hami-go-v2.10.json")["pod_devices_decode"]}
    assert cases["GPU-a,NVIDIA,3000,0:;"]["containers"][0][0]["usedmem"] == 3000
    assert len(cases["GPU-a,NVIDIA,3000,0:;"]["containers"]) == 2  # [dev], [] (not a container)
    assert len(decode_pod_devices(f"{X};")) == 1
    assert len(decode_pod_devices(f"{X};{Y};")) == 2


@pytest.mark.parametrize(
    ("entries", "asking", "expected"),
    [
        (1, [False, True], [1]),  # [c0 none, c1 1500 MiB] written X:;
        (2, [True, False, True], [0, 2]),  # [c0, c1 none, c2] written X:;Y:;
        (2, [True, True], [0, 1]),  # a full value: entry i is container i
        (3, [False, True, False], [0, 1, 2]),  # this project's own full value
        (0, [False], []),
        (1, [True, False, True], None),  # neither form: not this pod's value
    ],
)
def test_entries_map_onto_the_containers_that_ask(
    entries: int, asking: list[bool], expected: list[int] | None
) -> None:
    assert entry_containers(entries, asking) == expected


def test_which_containers_ask_for_the_type() -> None:
    zero = {"name": "z", "resources": {"limits": {"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1"}}}
    cores_only = {"name": "k", "resources": {"requests": {"nvidia.com/gpucores": "30"}}}
    assert requesting([container("a", 100), container("b", None), zero, cores_only], NAMES) == [
        True,
        False,
        False,
        True,
    ]


# --------------------------------------------------------------------------- node agent


async def _devices(backend: FakeBackend) -> Any:
    return await backend.enumerate()


async def test_allocate_gives_the_only_entry_to_the_container_that_asked(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    pod = go_pod(f"{X};", [container("c0", None), container("c1", 1500)])
    plan = plan_allocation(pod, backend, [1], await _devices(backend))
    (only,) = plan.containers
    assert (only.index, only.name) == (1, "c1")
    allocation = only.allocation
    assert allocation.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1500m"
    assert allocation.host_dirs == [f"{tmp_path}/containers/uid-go_c1"]
    assert plan.annotations == {TO_ALLOC: ";", keys.BIND_PHASE: "success"} and plan.done


async def test_allocate_skips_the_container_without_devices(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    containers = [
        container("c0", 1500),
        container("c1", None, env={"CUDA_DISABLE_CONTROL": "true"}),
        container("c2", 2000, env={"CUDA_DISABLE_CONTROL": "true"}),
    ]
    pod = go_pod(f"{X};{Y};", containers)
    devices = await _devices(backend)
    first = plan_allocation(pod, backend, [1], devices)
    assert [(c.index, c.name) for c in first.containers] == [(0, "c0")]
    assert first.annotations == {TO_ALLOC: f";{Y};"}
    mounts = {m.container_path for m in first.containers[0].allocation.mounts}
    assert "/etc/ld.so.preload" in mounts  # c0 did not disable HAMi-core
    pod["metadata"]["annotations"][TO_ALLOC] = first.annotations[TO_ALLOC]
    second = plan_allocation(pod, backend, [1], devices)
    (c2,) = second.containers
    assert (c2.index, c2.name) == (2, "c2")  # before the fix: c1, with c1's environment
    assert c2.allocation.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert c2.allocation.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert c2.allocation.host_dirs == [f"{tmp_path}/containers/uid-go_c2"]
    assert "/etc/ld.so.preload" not in {m.container_path for m in c2.allocation.mounts}
    assert second.done and second.annotations[TO_ALLOC] == ";;"


async def test_init_containers_come_first(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    pod = go_pod(f"{X};", [container("app", None)], init=[container("setup", 1500)])
    plan = plan_allocation(pod, backend, [1], await _devices(backend))
    assert [(c.index, c.name) for c in plan.containers] == [(0, "setup")]


async def test_a_value_that_fits_neither_form_is_refused(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    pod = go_pod(f"{X};", [container("a", 100), container("b", None), container("c", 100)])
    with pytest.raises(AllocateError, match=r"ns/go.*1 entries for 3 containers, 2 of which"):
        plan_allocation(pod, backend, [1], await _devices(backend))


# --------------------------------------------------------------------------- scheduler


def usage_of(pod: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
    cluster = Cluster([DeviceKind.from_backend(FakeBackend())])
    pod = {**pod, "spec": {**pod["spec"]}}
    record, errors = cluster.pod_record(pod)
    assert errors == [] and record is not None
    return {uuid: (u.slots, u.memory, u.cores) for uuid, u in record.usage.items()}


def test_usage_counts_app_containers_after_a_deviceless_init_container() -> None:
    # [init none, app 3000 MiB, app 2000 MiB] as Go writes it: both app containers hold the
    # device at once (before the fix: entry 0 read as the init container, 1 slot / 3000 MiB).
    value = f"{GPU},NVIDIA,3000,0:;{GPU},NVIDIA,2000,0:;"
    pod = go_pod(value, [container("a", 3000), container("b", 2000)], init=[container("i", None)])
    assert usage_of(pod) == {GPU: (2, 5000, 0)}


def test_usage_of_the_issue_values() -> None:
    assert usage_of(go_pod(f"{X};", [container("c0", None), container("c1", 1500)])) == {
        GPU: (1, 1500, 0)
    }
    three = [container("c0", 1500), container("c1", None), container("c2", 2000)]
    assert usage_of(go_pod(f"{X};{Y};", three)) == {GPU: (2, 3500, 30)}
    # An init container with the device, then an app container: the peak, not the sum.
    pod = go_pod(f"{X};{Y};", [container("c", 2000)], init=[container("i", 1500)])
    assert usage_of(pod) == {GPU: (1, 2000, 30)}
