"""Conformance of the node agent to protocol.md sections 1, 4 and 6."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from test_backend_cambricon import X4_1, backend, fake_cnmon
from test_backend_cambricon import request as cambricon_request
from test_node_unit import counting_clock, fake_backend

from hami import log
from hami.backends.base import BackendSettings, Device
from hami.backends.cambricon import CambriconBackend
from hami.node.metrics import NodeMetrics
from hami.node.registration import Registrar
from hami.node.state import DeviceState
from hami.protocol import ContainerDevice


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> None:
    log.configure("info", "console", stream=sys.__stderr__)


async def test_registrar_writes_nothing_when_the_devices_are_gone(tmp_path: Path) -> None:
    backend = fake_backend(tmp_path)
    state = DeviceState("fake", backend)
    state.bind_loop()
    state.set_enumerated(await backend.enumerate())
    writes: list[dict[str, str | None]] = []

    async def patch(annotations: Mapping[str, str | None]) -> None:
        writes.append(dict(annotations))

    registrar = Registrar(state, patch, period=30, metrics=NodeMetrics(), now=counting_clock())
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
