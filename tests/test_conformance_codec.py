"""Conformance of the codec and its callers to protocol.md sections 1, 3 and 4: a malformed
value is rejected with a ProtocolError (never another exception), so the scheduler rejects
only that node+type and the node's Allocate fails the pod cleanly."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from _core_helpers import MLU, NOW, NVIDIA, node, register
from _node_helpers import NODE, TO_ALLOC, MemoryKube, fake_backend
from _node_helpers import pod as node_pod

from hami import log
from hami.core.cluster import Cluster
from hami.node.allocate import AllocateError, Allocator
from hami.protocol import ProtocolError, decode_node_devices, decode_pod_devices, keys

HUGE = "1" + "0" * 5000  # more digits than int() converts from a string (4300)


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> None:
    log.configure("info", "console", stream=sys.__stderr__)


@pytest.mark.parametrize(
    ("decode", "value"),
    [
        (decode_node_devices, f"GPU-a,{HUGE},1,1,m,0,true:"),
        (decode_node_devices, f"GPU-a,10,1,1,m,0,true,{HUGE},hami-core:"),
        (decode_node_devices, f'[{{"id":"GPU-a","count":{HUGE}}}]'),
        (decode_pod_devices, f"GPU-a,NVIDIA,{HUGE},0:;"),
        (decode_pod_devices, f"GPU-a,NVIDIA,0,-{HUGE}:;"),
    ],
)
def test_huge_integer_is_a_protocol_error(decode: Callable[[str], object], value: str) -> None:
    with pytest.raises(ProtocolError, match=r"int32|int64|invalid JSON"):
        decode(value)


def test_huge_integer_rejects_only_that_node_type() -> None:
    c = Cluster([NVIDIA, MLU])
    obj = node("n", f"GPU-a,{HUGE},1,1,m,0,true:")
    mlu = register(["MLU-a"], model="MLU-MLU370-X4", cores=0)
    obj["metadata"]["annotations"].update(
        {
            "hami.io/node-mlu-register": mlu,
            "hami.io/node-handshake-mlu": "Reported_2024-05-20 09:59:00",
        }
    )
    errors, _ = c.upsert_node(obj, NOW)
    assert len(errors) == 1 and "int32" in errors[0]
    c.refresh(NOW)
    types = c.nodes["n"].types
    assert not types["nvidia"].available
    assert "int32" in (types["nvidia"].reason or "")
    assert types["mlu"].available and len(types["mlu"].devices) == 1


async def test_allocate_huge_integer_fails_the_pod_and_releases_the_lock(tmp_path: Path) -> None:
    kube = MemoryKube()
    kube.add(node_pod("p", f"GPU-u-0,NVIDIA,{HUGE},0:;"))
    kube._merge(kube.nodes[NODE], {keys.NODE_LOCK: "2024-05-20T10:00:00Z,ns,p"})
    backend = fake_backend(tmp_path)
    allocator = Allocator(NODE, kube, now=lambda: datetime(2024, 5, 20, 10, tzinfo=UTC))
    with pytest.raises(AllocateError, match=r"ns/p.*int32"):
        await allocator.allocate(backend, [1], await backend.enumerate())
    assert kube.annotations("p")[keys.BIND_PHASE] == "failed"
    assert kube.annotations("p")[TO_ALLOC].startswith("GPU-u-0")  # left as it was
    assert keys.NODE_LOCK not in kube.nodes[NODE]["metadata"]["annotations"]
