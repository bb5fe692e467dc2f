"""ResourceSlice/DeviceClass bodies against the real API server (strict field validation),
and the publisher keeping a node's slice current: no flapping, generation bumps on change,
repair after deletion, withdrawal on stop."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hami.backends.base import BackendSettings
from hami.backends.fake import FakeBackend
from hami.dra import slices
from hami.dra.publisher import CLASSES_PATH, SLICES_PATH, SlicePublisher
from hami.kube.client import Kube
from hami.kube.raw import NotFound
from hami.node.state import DeviceState

STRICT = [("fieldValidation", "Strict")]


def make_backend() -> FakeBackend:
    word = f"t{uuid.uuid4().hex[:8]}"  # a driver of its own: DeviceClasses are cluster-wide
    options = {
        "type": word,
        "vendor": word.upper(),
        "devices": [{"count": 2, "model": "Model-X", "memory": 40960, "numa": 1}],
    }
    return FakeBackend(BackendSettings(split_count=4, options=options))


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll for up to 20 s (bounded; the steps are a fraction of the publisher's period)."""
    for _ in range(400):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within 20 s: {what}")


async def test_bodies_pass_strict_validation_dry_run_and_real(kube: Kube) -> None:
    backend = make_backend()
    node = f"n-{uuid.uuid4().hex[:6]}"
    devices = await backend.enumerate()
    body = slices.resource_slice(node, backend, devices)
    cls = slices.device_class(backend)
    for path, item in ((SLICES_PATH, body), (CLASSES_PATH, cls)):
        dry = await kube.request("POST", path, body=item, query=[*STRICT, ("dryRun", "All")])
        assert dry["metadata"]["name"] == item["metadata"]["name"]
        await kube.request("POST", path, body=item, query=STRICT)
    stored = await kube.request("GET", f"{SLICES_PATH}/{body['metadata']['name']}")
    dev = stored["spec"]["devices"][0]
    assert dev["allowMultipleAllocations"] is True
    assert dev["capacity"]["slots"]["requestPolicy"]["validValues"] == ["1"]
    # read back, the stored slice is "no change" for the pure comparison
    assert slices.next_slice(node, backend, devices, stored) is None
    await kube.delete(f"{SLICES_PATH}/{body['metadata']['name']}")
    await kube.delete(f"{CLASSES_PATH}/{cls['metadata']['name']}")


async def test_publisher_keeps_the_slice_current_and_withdraws_it(kube: Kube) -> None:
    backend = make_backend()
    node = f"n-{uuid.uuid4().hex[:6]}"
    state = DeviceState("fake", backend)
    state.bind_loop()
    state.set_enumerated(await backend.enumerate())
    publisher = SlicePublisher(kube, node, backend, state, period=0.2, min_backoff=0.1)
    path = publisher.path

    async def get() -> dict[str, Any] | None:
        try:
            return await kube.request("GET", path)
        except NotFound:
            return None

    task = asyncio.create_task(publisher.run())
    try:
        async with asyncio.timeout(20):
            await publisher.published.wait()
        cls = await kube.request("GET", f"{CLASSES_PATH}/{backend.type_word}.hami.io")
        assert cls["spec"]["selectors"][0]["cel"]["expression"].endswith(
            f'"{backend.type_word}.hami.io"'
        )
        first = await get()
        assert first is not None
        assert first["spec"]["pool"]["generation"] == 0
        assert len(first["spec"]["devices"]) == 2

        # several resyncs with nothing changed: no write (40960Mi reads back as 40Gi)
        syncs = publisher.syncs
        await eventually(lambda: _true(publisher.syncs >= syncs + 3), "resyncs")
        assert publisher.writes == 1

        # a device turns unhealthy: it is tainted (the API server serves device taints by
        # default in 1.36 and stamps their time), the pool generation bumps
        state.on_health(state.devices[1].uuid, False)

        async def tainted() -> bool:
            item = await get()
            return item is not None and bool(item["spec"]["devices"][1].get("taints"))

        await eventually(tainted, "unhealthy device tainted")
        item = await get()
        assert item is not None and item["spec"]["pool"]["generation"] == 1
        assert publisher.taints_served
        (taint,) = item["spec"]["devices"][1]["taints"]
        assert (taint["key"], taint["value"], taint["effect"]) == (
            "hami.io/unhealthy",
            "unhealthy",  # a health event names no cause
            "NoSchedule",
        )
        assert taint["timeAdded"]
        assert item["spec"]["devices"][1]["attributes"]["healthy"] == {"bool": False}
        assert "taints" not in item["spec"]["devices"][0]
        # the time the server added is no change: resyncs write nothing
        writes, syncs = publisher.writes, publisher.syncs
        await eventually(lambda: _true(publisher.syncs >= syncs + 3), "resyncs")
        assert publisher.writes == writes

        # healthy again: the taint goes
        state.on_health(state.devices[1].uuid, True)

        async def untainted() -> bool:
            item = await get()
            return item is not None and "taints" not in item["spec"]["devices"][1]

        await eventually(untainted, "taint removed")

        # someone deletes the slice: the next resync writes it again
        await kube.delete(path)
        await eventually(lambda: _present(get), "slice recreated")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert await get() is None  # the agent stopped serving the node: slice withdrawn
    with contextlib.suppress(NotFound):
        await kube.delete(f"{CLASSES_PATH}/{backend.type_word}.hami.io")


async def _true(value: bool) -> bool:
    return value


async def _present(get: Callable[[], Awaitable[Any]]) -> bool:
    return await get() is not None


pytestmark = pytest.mark.controlplane
