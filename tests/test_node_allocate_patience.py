"""kubelet's Allocate waits out a short API server outage (issue 9 item 4): a pod whose
Allocate fails is Failed for good, so the node agent retries its reads and its write with
back-off for a bounded time instead of failing the pod at the first refused connection."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hami.backends.base import BackendSettings
from hami.backends.fake import FakeBackend
from hami.node.allocate import AllocateError, Allocator, KubeCalls
from hami.protocol import keys

NODE = "node-p"
TO_ALLOC = "hami.io/vgpu-devices-to-allocate"


class Away(Exception):
    """The API server did not answer."""


class FlakyKube:
    """One node and one pending pod; the first ``outage`` calls fail as if the API were away."""

    def __init__(self, outage: int) -> None:
        self.outage = outage
        self.calls = 0
        self.node: dict[str, Any] = {"metadata": {"name": NODE, "annotations": {}}}
        self.pod: dict[str, Any] = {
            "metadata": {
                "namespace": "ns",
                "name": "p",
                "annotations": {
                    keys.VGPU_NODE: NODE,
                    keys.BIND_PHASE: "allocating",
                    TO_ALLOC: "GPU-p-0,NVIDIA,1000,0:;",
                },
            },
            "spec": {"nodeName": NODE, "containers": [{"name": "c0"}]},
            "status": {"phase": "Pending"},
        }

    def _call(self) -> None:
        self.calls += 1
        if self.calls <= self.outage:
            raise Away("connection refused")

    def kube(self) -> KubeCalls:
        async def get_node(name: str) -> dict[str, Any]:
            self._call()
            return self.node

        async def get_pod(ns: str, name: str) -> dict[str, Any]:
            self._call()
            return self.pod

        async def list_pods(selector: str) -> list[dict[str, Any]]:
            self._call()
            return [self.pod]

        async def patch_node(name: str, changes: Mapping[str, str | None], rv: str | None) -> None:
            self._call()

        async def patch_pod(ns: str, name: str, changes: Mapping[str, str | None]) -> None:
            self._call()
            self.pod["metadata"]["annotations"].update(changes)

        return KubeCalls(
            get_node,
            get_pod,
            list_pods,
            patch_node,
            patch_pod,
            is_transient=lambda exc: isinstance(exc, Away),
        )


def backend(tmp: Path) -> FakeBackend:
    return FakeBackend(
        BackendSettings(
            options={
                "devices": [{"count": 1, "model": "NVIDIA-Test", "memory": 16384}],
                "uuid_prefix": "GPU-p",
                "hamicore": {"containers_dir": str(tmp / "c")},
            }
        )
    )


async def test_allocate_waits_out_a_short_outage(tmp_path: Path) -> None:
    flaky = FlakyKube(outage=6)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    allocator = Allocator(NODE, flaky.kube(), api_wait=60, sleep=sleep)
    fake = backend(tmp_path)
    plan = await allocator.allocate(fake, [1], await fake.enumerate())
    assert plan.done and flaky.pod["metadata"]["annotations"][keys.BIND_PHASE] == "success"
    assert len(slept) == 6 and max(slept) <= 5.0  # capped back-off, no real waiting


async def test_allocate_fails_once_the_outage_outlasts_the_bound(tmp_path: Path) -> None:
    flaky = FlakyKube(outage=10**6)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    allocator = Allocator(NODE, flaky.kube(), api_wait=30, sleep=sleep)
    fake = backend(tmp_path)
    with pytest.raises(AllocateError, match="cannot read the node or its pods"):
        await allocator.allocate(fake, [1], await fake.enumerate())
    assert 25 <= sum(slept) <= 30
