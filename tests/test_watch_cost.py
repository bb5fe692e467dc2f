"""Watch handling stays cheap: line decoding over arbitrary chunking, and pod events that
change nothing hami reads stop before the cluster state (costs: bench/bench_watch.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hami import config
from hami.backends.nvidia_names import NVIDIA_ALLOCATED, NVIDIA_RESOURCES, NVIDIA_TO_ALLOCATE
from hami.core.requests import DeviceKind
from hami.kube.client import _json_lines
from hami.protocol import ContainerDevice, encode_pod_devices
from hami.scheduler.service import Scheduler

KIND = DeviceKind("nvidia", "NVIDIA", NVIDIA_RESOURCES, NVIDIA_ALLOCATED, NVIDIA_TO_ALLOCATE)


class _Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


class _Response:
    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _Content(chunks)


async def _decode(chunks: list[bytes]) -> list[Any]:
    return [e async for e in _json_lines(_Response(chunks))]  # type: ignore[arg-type]


EVENTS = [
    {"type": "ADDED", "object": {"metadata": {"name": f"p{i}", "x": "é" * i}}} for i in range(7)
]
STREAM = b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(STREAM)])
async def test_lines_decode_the_same_however_the_stream_is_chunked(size: int) -> None:
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert await _decode(chunks) == EVENTS


async def test_blank_lines_are_skipped_and_an_unfinished_last_line_is_not_decoded() -> None:
    first, second = (json.dumps(e).encode() for e in EVENTS[:2])
    assert await _decode([b"\n", first + b"\n\r\n  \n", second[:5], second[5:]]) == EVENTS[:1]


async def test_a_line_that_is_not_json_raises_value_error() -> None:
    with pytest.raises(ValueError):
        await _decode([b'{"type": "ADDED"}\n', b"{not json}\n"])


def _scheduler() -> Scheduler:
    return Scheduler(config.from_mapping({}, env={}).scheduler, [KIND], None, emit_events=False)


def _pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def _holding(name: str) -> dict[str, Any]:
    entry = [[ContainerDevice("GPU-0", "NVIDIA", 1000, 0)]]
    return _pod(
        name,
        {
            "hami.io/vgpu-node": "n1",
            "hami.io/vgpu-devices-allocated": encode_pod_devices(entry),
            "hami.io/bind-phase": "success",
        },
    )


class _Spy:
    def __init__(self, scheduler: Scheduler) -> None:
        self.calls: list[str] = []
        cluster = scheduler.cluster
        upsert, delete = cluster.upsert_pod, cluster.delete_pod

        def spy_upsert(obj: Any, now: Any = None) -> list[str]:
            self.calls.append("upsert")
            return upsert(obj, now)

        def spy_delete(key: str) -> None:
            self.calls.append("delete")
            delete(key)

        cluster.upsert_pod = spy_upsert  # type: ignore[method-assign]
        cluster.delete_pod = spy_delete  # type: ignore[method-assign]


def test_pods_that_hold_nothing_never_reach_the_cluster_state() -> None:
    scheduler = _scheduler()
    spy = _Spy(scheduler)
    for kind in ("ADDED", "MODIFIED", "MODIFIED", "DELETED"):
        scheduler.on_pod(kind, _pod("web"))
    assert spy.calls == []
    assert scheduler.cluster.pods == {}


def test_a_pod_that_holds_devices_is_still_recorded_updated_and_released() -> None:
    scheduler = _scheduler()
    spy = _Spy(scheduler)
    scheduler.on_pod("ADDED", _pod("gpu"))  # no annotations yet: skipped
    scheduler.on_pod("MODIFIED", _holding("gpu"))
    assert "ns/gpu" in scheduler.cluster.pods
    # Its annotations gone (a status-only view would not do that, but a rewrite may):
    # the record it had must go, so this event is not skipped.
    scheduler.on_pod("MODIFIED", _pod("gpu"))
    assert "ns/gpu" not in scheduler.cluster.pods
    scheduler.on_pod("MODIFIED", _holding("gpu"))
    scheduler.on_pod("DELETED", _holding("gpu"))
    assert "ns/gpu" not in scheduler.cluster.pods
    assert spy.calls == ["upsert", "upsert", "upsert", "delete"]


def test_a_pod_with_rejected_annotations_is_looked_at_until_they_are_fixed() -> None:
    scheduler = _scheduler()
    bad = _pod("bad", {"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": "junk"})
    scheduler.on_pod("ADDED", bad)
    assert scheduler._pod_errors.get("ns/bad")
    bad["metadata"]["annotations"] = {}  # the annotations removed: the error is cleared
    scheduler.on_pod("MODIFIED", bad)
    assert "ns/bad" not in scheduler._pod_errors
