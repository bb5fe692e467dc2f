"""The fallback when kube-apiserver does not serve device taints: a kube-apiserver 1.36.2
of its own started with ``--feature-gates=DRADeviceTaints=false`` (as 1.33-1.35 are by
default) drops the taints of a ResourceSlice without an error. The publisher sees that in
the answer to its write, says so once, and leaves unhealthy devices out of the slice
instead (the behaviour before taints); a device healthy again comes back. The same for a
MIG GPU's partitions (a pool of several slices)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from structlog.testing import capture_logs
from test_dra_migslices_api import _State, h200

from hami.backends.base import BackendSettings
from hami.backends.fake import FakeBackend
from hami.dra.publisher import CLASSES_PATH, SlicePublisher
from hami.kube.client import Kube, open_client
from hami.kube.raw import NotFound
from hami.node.state import DeviceState
from hami.testkit.controlplane import ControlPlane, find_binaries

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

NODE = "gate-off"


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    own = ControlPlane(
        binaries=find_binaries(), extra_apiserver_args=["--feature-gates=DRADeviceTaints=false"]
    )
    own.start()
    try:
        yield own
    finally:
        own.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def kube(plane: ControlPlane) -> AsyncIterator[Kube]:
    async with open_client(plane.kubeconfig) as client:
        yield client


async def eventually(check: Any, what: str) -> None:
    for _ in range(400):  # bounded: 20 s
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within 20 s: {what}")


async def test_unhealthy_devices_leave_the_slice_when_taints_are_dropped(kube: Kube) -> None:
    options = {
        "uuid_prefix": "GPU-g",
        "devices": [{"count": 3, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960}],
    }
    backend = FakeBackend(BackendSettings(options=options))
    assert backend.inject_xid("GPU-g-1", 79)
    state = DeviceState("fake", backend)
    state.bind_loop()
    state.set_enumerated(await backend.enumerate())

    async def refresh() -> None:
        state.set_enumerated(await backend.enumerate())

    with capture_logs() as logs:
        publisher = SlicePublisher(
            kube, NODE, backend, state, period=0.2, min_backoff=0.1, refresh=refresh
        )

        async def names() -> list[str]:
            try:
                item = await kube.request("GET", publisher.path)
            except NotFound:
                return []
            devices = item["spec"]["devices"]
            assert not any(d.get("taints") for d in devices)  # never stored here
            return [d["name"] for d in devices]

        task = asyncio.create_task(publisher.run())
        try:
            async with asyncio.timeout(20):
                await publisher.published.wait()
            assert not publisher.taints_served
            assert await names() == ["nvidia-0", "nvidia-2"]
            # another device falls ill: it leaves too, and nothing is said again
            assert backend.inject_xid("GPU-g-2", 48)

            async def one_left() -> bool:
                return await names() == ["nvidia-0"]

            await eventually(one_left, "the second unhealthy device left")
            # recovery brings a device back
            backend.set_health("GPU-g-1", True)

            async def back() -> bool:
                return await names() == ["nvidia-0", "nvidia-1"]

            await eventually(back, "the recovered device back in the slice")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            with contextlib.suppress(NotFound):
                await kube.delete(f"{CLASSES_PATH}/nvidia.hami.io")
    said = [e for e in logs if e["event"] == "dra_device_taints_not_served"]
    assert len(said) == 1, said
    assert said[0]["log_level"] == "warning"
    assert "DRADeviceTaints" in said[0]["why"]


async def test_an_unhealthy_mig_gpu_leaves_the_pool_when_taints_are_dropped(kube: Kube) -> None:
    """The MIG pool (several slices) falls back the same way: the sick GPU's partitions and
    counter set leave the pool, and come back on recovery."""
    sick = dataclasses.replace(h200(0), healthy=False, unhealthy_reason="xid-79")
    state = _State([sick, h200(1)])
    backend = FakeBackend(BackendSettings(options={"type": "nvidia", "vendor": "NVIDIA"}))
    node = f"{NODE}-mig"

    async def pool() -> tuple[set[str], list[str]]:
        items, _ = await kube.list_all(
            "/apis/resource.k8s.io/v1/resourceslices",
            query=[("fieldSelector", f"spec.nodeName={node}")],
        )
        devices = [d for s in items for d in s["spec"].get("devices") or []]
        assert not any(d.get("taints") for d in devices)  # never stored here
        sets = [c["name"] for s in items for c in s["spec"].get("sharedCounters") or []]
        return {d["name"].split("-mig-")[0] for d in devices}, sorted(sets)

    with capture_logs() as logs:
        publisher = SlicePublisher(kube, node, backend, state, period=0.2, min_backoff=0.1)
        task = asyncio.create_task(publisher.run())
        try:
            async with asyncio.timeout(20):
                await publisher.published.wait()

            async def only_the_well_gpu() -> bool:
                return await pool() == ({"nvidia-1"}, ["nvidia-1-mig"])

            await eventually(only_the_well_gpu, "the sick GPU out of the pool")
            assert not publisher.taints_served
            state.set([h200(0), h200(1)])

            async def both() -> bool:
                return await pool() == ({"nvidia-0", "nvidia-1"}, ["nvidia-0-mig", "nvidia-1-mig"])

            await eventually(both, "the recovered GPU back in the pool")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            with contextlib.suppress(NotFound):
                await kube.delete(f"{CLASSES_PATH}/nvidia.hami.io")
    said = [e for e in logs if e["event"] == "dra_device_taints_not_served"]
    assert len(said) == 1, said
