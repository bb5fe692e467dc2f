"""Conformance of the node agent to protocol.md sections 1, 4 and 6."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from test_node_unit import counting_clock, fake_backend

from hami import log
from hami.backends.base import Device
from hami.node.metrics import NodeMetrics
from hami.node.registration import Registrar
from hami.node.state import DeviceState


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
