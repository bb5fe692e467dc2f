"""The MIG pool's slices (hami.dra.migslices) against the real API server: every slice of a
9-GPU node passes strict validation (partitions in device slices of at most 64, counter
sets in slices of their own, at most 8 each), the limits are the server's own (65 devices
consuming counters in one slice are refused), and the publisher keeps the pool current:
no rewrite without a change, the whole pool at the next generation on one, the slices
no longer needed deleted, all of them withdrawn on stop; an unhealthy GPU's partitions are
tainted and untainted on recovery."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from typing import Any

import pytest

from hami.backends.base import Backend, BackendSettings, Device, MigCapability
from hami.backends.fake import FakeBackend
from hami.backends.mig_tables import MIG_PROFILES
from hami.dra import migslices
from hami.dra.publisher import CLASSES_PATH, SLICES_PATH, SlicePublisher
from hami.kube.client import Kube
from hami.kube.raw import KubeError, NotFound
from hami.protocol.mig import MigProfile
from hami.testkit.cluster import poll

pytestmark = [pytest.mark.controlplane]
STRICT = [("fieldValidation", "Strict")]


def backend(word: str = "nvidia") -> Backend:
    return FakeBackend(BackendSettings(options={"type": word, "vendor": word.upper()}))


def h200(index: int) -> Device:
    profiles = tuple(
        MigProfile(p.name.removeprefix("MIG "), p.memory_mb, 0, p.slice_count, p.placements)
        for p in MIG_PROFILES["H200"]
        if p.profile_id in (0, 1, 2, 3, 4)
    )
    return Device(f"GPU-h200-{index}", index, "NVIDIA-H200", 143771, mig=MigCapability(profiles, 7))


async def test_a_nine_gpu_pool_passes_validation_and_the_limit_is_real(kube: Kube) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    bodies = migslices.pool_slices(node, backend(), [h200(i) for i in range(9)])
    assert len(bodies) == 4  # 126 partitions in 2 device slices, 9 counter sets in 2
    try:
        for body in bodies:
            await kube.request("POST", SLICES_PATH, body=body, query=STRICT)
        stored = await kube.request("GET", f"{SLICES_PATH}/{node}-nvidia-hami-io-counters-2")
        assert [s["name"] for s in stored["spec"]["sharedCounters"]] == ["nvidia-8-mig"]
        # one slice of 65 devices that consume counters: the server's own limit refuses it
        devices = [d for b in bodies for d in b["spec"].get("devices", [])][:65]
        big = migslices.pool_slices(f"{node}-x", backend(), [])[0]
        big["spec"]["devices"] = devices
        with pytest.raises(KubeError) as refused:
            await kube.request("POST", SLICES_PATH, body=big, query=STRICT)
        assert refused.value.status == 422
        assert "64" in str(refused.value)
        # counters and devices in one slice: refused too (1.36 keeps them apart)
        mixed = dict(bodies[0], metadata={"name": f"{node}-mixed"})
        mixed["spec"] = {**bodies[0]["spec"], "sharedCounters": bodies[2]["spec"]["sharedCounters"]}
        with pytest.raises(KubeError) as both:
            await kube.request("POST", SLICES_PATH, body=mixed, query=STRICT)
        assert both.value.status == 422
    finally:
        for body in bodies:
            with contextlib.suppress(NotFound):
                await kube.request("DELETE", f"{SLICES_PATH}/{body['metadata']['name']}")


class _State:
    """The publisher's view of the devices (hami.node.state.DeviceState's surface)."""

    def __init__(self, devices: list[Device]) -> None:
        self.version = 0
        self._devices = devices
        self._changed = asyncio.Event()

    @property
    def devices(self) -> list[Device]:
        return self._devices

    def set(self, devices: list[Device]) -> None:
        self._devices = devices
        self.version += 1
        self._changed.set()

    async def wait_changed(self, seen: int) -> int:
        while self.version == seen:
            self._changed.clear()
            await self._changed.wait()
        return self.version


async def _names(kube: Kube, node: str, word: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for suffix in ("", "-2", "-counters-1", "-counters-2"):
        name = f"{node}-{word}-hami-io{suffix}"
        with contextlib.suppress(NotFound):
            out[name] = await kube.request("GET", f"{SLICES_PATH}/{name}")
    return out


async def test_publisher_keeps_the_mig_pool_current_and_withdraws_it(kube: Kube) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    word = f"t{uuid.uuid4().hex[:8]}"  # a driver of its own: DeviceClasses are cluster-wide
    state = _State([h200(i) for i in range(9)])
    publisher = SlicePublisher(kube, node, backend(word), state, period=0.2, min_backoff=0.05)
    task = asyncio.create_task(publisher.run())
    try:
        async with asyncio.timeout(20):
            await publisher.published.wait()
        first = await _names(kube, node, word)
        assert len(first) == 4
        assert {s["spec"]["pool"]["generation"] for s in first.values()} == {0}
        await asyncio.sleep(1.0)  # five periods: nothing changed, nothing written
        assert publisher.writes == 1 and publisher.syncs > 2
        state.set([h200(i) for i in range(8)])

        async def three() -> bool:
            return len(await _names(kube, node, word)) == 3

        await poll(three, 20, "the pool cut to three slices")
        now = await _names(kube, node, word)
        assert {s["spec"]["pool"]["generation"] for s in now.values()} == {1}
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in now.values()} == {3}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert await _names(kube, node, word) == {}  # withdrawn on stop
    with contextlib.suppress(NotFound):
        await kube.request("DELETE", f"{CLASSES_PATH}/{word}.hami.io")


def _sick(device: Device) -> Device:
    return dataclasses.replace(device, healthy=False, unhealthy_reason="xid-79")


async def test_an_unhealthy_mig_gpu_is_tainted_then_untainted(kube: Kube) -> None:
    """The MIG pool with device taints as kube-apiserver 1.36 serves them: every partition
    of the sick GPU carries the taint (stamped, and never rewritten for the stamp), the
    healthy GPU's none, and recovery takes the taint away."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    word = f"t{uuid.uuid4().hex[:8]}"
    state = _State([h200(0), h200(1)])
    publisher = SlicePublisher(kube, node, backend(word), state, period=0.2, min_backoff=0.05)

    async def tainted() -> dict[str, list[dict[str, Any]]]:
        found = await _names(kube, node, word)
        devices = [d for s in found.values() for d in s["spec"].get("devices", [])]
        return {d["name"]: d["taints"] for d in devices if d.get("taints")}

    task = asyncio.create_task(publisher.run())
    try:
        async with asyncio.timeout(20):
            await publisher.published.wait()
        assert await tainted() == {}
        state.set([_sick(h200(0)), h200(1)])

        async def sick() -> bool:
            return bool(await tainted())

        await poll(sick, 20, "the sick GPU's partitions tainted")
        now = await tainted()
        assert publisher.taints_served
        assert sorted(now) == sorted(p for p in now if p.startswith(f"{word}-0-mig-"))
        assert len(now) == 14  # every partition of GPU 0, none of GPU 1
        for taints in now.values():
            (taint,) = taints
            assert (taint["key"], taint["value"], taint["effect"]) == (
                "hami.io/unhealthy",
                "xid-79",
                "NoSchedule",
            )
            assert taint["timeAdded"]  # stamped by kube-apiserver
        writes = publisher.writes
        await asyncio.sleep(1.0)  # five periods: the stamp is no change
        assert publisher.writes == writes
        state.set([h200(0), h200(1)])

        async def healed() -> bool:
            return await tainted() == {}

        await poll(healed, 20, "the recovered GPU untainted")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(NotFound):
            await kube.request("DELETE", f"{CLASSES_PATH}/{word}.hami.io")
