"""Conformance of the node agent to protocol.md sections 1, 4 and 6."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from _cambricon_helpers import X4_1, backend, fake_cnmon
from _cambricon_helpers import request as cambricon_request
from _core_helpers import NOW
from _node_helpers import ALLOCATED, NODE, TO_ALLOC, MemoryKube, counting_clock, fake_backend
from _node_helpers import pod as node_pod
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hami import log
from hami.backends.base import BackendSettings, Device
from hami.backends.cambricon import CambriconBackend
from hami.node.allocate import AllocateError, Allocator
from hami.node.metrics import NodeMetrics
from hami.node.registration import Registrar
from hami.node.state import DeviceState
from hami.protocol import ContainerDevice, decode_pod_devices, first_pending_entry, keys


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> None:
    log.configure("info", "console", stream=sys.__stderr__)


async def test_registrar_writes_nothing_when_the_devices_are_gone(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    state = DeviceState("fake", backend)
    state.bind_loop()
    state.set_enumerated(await backend.enumerate())
    kube = MemoryKube()
    writes = kube.node_patches
    registrar = Registrar(
        state, kube, node=NODE, period=30, metrics=NodeMetrics(), now=counting_clock()
    )
    assert await registrar.write_once()
    assert len(writes) == 1
    empty: list[Device] = []
    state.set_enumerated(empty)  # e.g. the driver lost every device
    assert await registrar.write_once()
    # Not register "" (which every reader rejects as malformed), and no heartbeat either.
    assert len(writes) == 1
    state.set_enumerated(await backend.enumerate())
    assert await registrar.write_once()
    assert len(writes) == 2 and writes[1]["hami.io/node-nvidia-register"]


@pytest.mark.parametrize(
    ("scaling", "memory", "split"),
    [
        (0.5, 11654, False),  # 100 % of the registered (scaled) memory: a whole card
        (0.5, 5827, True),
        (2.0, 23308, True),  # half of the registered memory: a slice
        (2.0, 46616, False),
    ],
)
async def test_mlu_split_is_relative_to_the_registered_memory(
    tmp_path: Path, scaling: float, memory: int, split: bool
) -> None:
    cards = await backend(fake_cnmon(tmp_path, "file")).enumerate()
    mlu = CambriconBackend(BackendSettings(memory_scaling=scaling))
    registered = mlu.to_node_devices(cards)[1].memory
    assert registered == int(23308 * scaling)
    answer = mlu.allocate(cambricon_request([ContainerDevice(X4_1, "MLU", memory, 0)], cards))
    assert ("CAMBRICON_SPLIT_ENABLE" in answer.envs) is split
    assert answer.envs["CAMBRICON_SPLIT_MEMS"] == str(memory)


# Garbage in pod annotations never crashes the node's Allocate: it answers with an
# AllocateError naming the pod, marks the pod failed and releases the node lock.
_numbers = ["0", "3000", "-1", "1" + "0" * 5000, "x"]
_number = st.one_of(st.sampled_from(_numbers), st.text(max_size=3))
_device = st.tuples(
    st.sampled_from(["GPU-u-0", "GPU-u-1", "GPU-zz", ""]),
    st.sampled_from(["NVIDIA", "MLU", ""]),
    _number,
    _number,
).map(lambda t: ",".join(t) + ":")
_entry = st.lists(st.one_of(_device, st.text(max_size=4)), max_size=3).map(
    lambda d: "".join(d) + ";"
)
_structured = st.lists(_entry, max_size=3).map("".join)
_garbage = st.one_of(st.text(max_size=60), _structured)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_garbage, bind_time=_garbage, containers=st.integers(0, 3))
# A later entry that decodes but cannot be written back (empty uuid) once ran past the
# pod-failing path: an unexpected ProtocolError, the pod left allocating, the lock held.
@example(value=",NVIDIA,0,0;,,0,0;", bind_time="", containers=1)
def test_garbage_to_allocate_never_crashes_allocate(
    tmp_path_factory: pytest.TempPathFactory, value: str, bind_time: str, containers: int
) -> None:
    tmp = tmp_path_factory.mktemp("alloc")
    kube = MemoryKube()
    p = node_pod("p", value, containers=containers, bind_time=bind_time)
    kube.add(p)
    kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: "2024-05-20T10:00:00Z,ns,p"})
    backend = fake_backend(tmp)

    try:
        pending = first_pending_entry(decode_pod_devices(value)) is not None
    except ValueError:
        pending = True  # malformed: the pod is found, and failed

    async def run() -> None:
        allocator = Allocator(NODE, kube, now=lambda: NOW)
        try:
            plan = await allocator.allocate(backend, [1], await backend.enumerate())
        except AllocateError as exc:
            if pending:  # the pod was found: it is failed, named, and the lock released
                assert kube.annotations("p")[keys.BIND_PHASE] == "failed"
                assert "ns/p" in str(exc)
                assert keys.NODE_LOCK not in kube.nodes[NODE]["metadata"]["annotations"]
            else:
                assert "no pending pod" in str(exc)
        else:
            assert plan.pod == "ns/p"
        # The value is never emptied nor removed; the lasting record is never touched.
        assert kube.annotations("p")[TO_ALLOC] != "" or value == ""
        assert kube.annotations("p")[ALLOCATED] == value

    asyncio.run(run())
