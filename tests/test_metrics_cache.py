"""The scheduler's ``/metrics`` body kept between changes (hami.scheduler.metrics): joined
and compressed in a worker thread from a snapshot of the kept text, kept until a node or a
pod changes, the gzip body one stream spliced from the kept deflate data and the per-scrape
counters. Pure logic on ``Cluster`` (no API server)."""

from __future__ import annotations

import asyncio
import gzip
import os
import threading
import zlib
from typing import Any

import pytest
from _core_helpers import NOW, node, register
from test_metrics_text import MODEL, cluster, running, samples, two_nodes, value

from hami.protocol import ContainerDevice
from hami.scheduler import metrics
from hami.scheduler.metrics import SchedulerMetrics, crc32_combine

MIB = 1024 * 1024


async def scrape(m: SchedulerMetrics, *, gzipped: bool) -> bytes:
    pieces: list[bytes] = []

    async def write(data: bytes) -> None:
        pieces.append(bytes(data))

    await m.write_to(write, gzip=gzipped)
    return b"".join(pieces)


def gunzip_one_member(body: bytes) -> bytes:
    """The body as a client that reads a single gzip member (aiohttp, curl) reads it."""
    reader = zlib.decompressobj(16 + zlib.MAX_WBITS)
    text = reader.decompress(body)
    assert reader.eof and not reader.unused_data  # one whole member, nothing after it
    return text


def counting_builds(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    calls: list[bool] = []
    build = metrics._build

    def counted(*args: Any) -> Any:
        calls.append(args[2])
        return build(*args)

    monkeypatch.setattr(metrics, "_build", counted)
    return calls


@pytest.mark.parametrize("length", [0, 1, 7, 4096, 1 << 20, 3_000_001])
def test_crc32_combine_is_zlibs(length: int) -> None:
    first, second = os.urandom(333), os.urandom(length)
    combined = crc32_combine(zlib.crc32(first), zlib.crc32(second), length)
    assert combined == zlib.crc32(first + second)


async def test_gzip_and_plain_agree_and_gzip_is_one_stream() -> None:
    c = cluster()
    two_nodes(c)
    c.upsert_pod(running("p", "a", [[ContainerDevice("GPU-a0", "NVIDIA", 3000, 30)]]), NOW)
    m = SchedulerMetrics(c)
    plain = await scrape(m, gzipped=False)
    packed = await scrape(m, gzipped=True)
    assert gunzip_one_member(packed) == plain == gzip.decompress(packed) == m.render()
    found = samples(plain)
    assert value(found, "hami_gpu_memory_allocated_bytes", device_uuid="GPU-a0") == 3000 * MIB
    assert value(found, "hami_pods_holding_devices") == 1

    m.cluster_gauges = False  # a standby: the counters alone, still one gzip stream
    assert gunzip_one_member(await scrape(m, gzipped=True)) == await scrape(m, gzipped=False)


async def test_no_change_answers_from_the_kept_body(monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster()
    two_nodes(c)
    m = SchedulerMetrics(c)
    builds = counting_builds(monkeypatch)
    first = await scrape(m, gzipped=True)
    kept = m.cluster_text._packed
    assert builds == [True]
    m.filter_total.labels("scheduled").inc()  # the counters are read every scrape
    c.release("team/never-reserved")  # reported as changed, yet no line changes
    assert c.changed_pods == {"team/never-reserved"}
    second = await scrape(m, gzipped=True)
    assert builds == [True]  # nothing built again
    assert m.cluster_text._packed is kept
    assert value(samples(gunzip_one_member(second)), "hami_filter_total", outcome="scheduled") == 1
    assert gunzip_one_member(first) != gunzip_one_member(second)

    plain = await scrape(m, gzipped=False)
    assert builds == [True, False]  # the plain body is built once, then kept too
    assert await scrape(m, gzipped=False) == plain
    assert builds == [True, False]
    assert gunzip_one_member(await scrape(m, gzipped=True)) == plain
    assert builds == [True, False]


async def test_a_change_shows_in_the_next_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster()
    two_nodes(c)
    m = SchedulerMetrics(c)
    builds = counting_builds(monkeypatch)
    for gzipped in (True, False):
        await scrape(m, gzipped=gzipped)
    builds.clear()

    c.upsert_pod(running("p", "a", [[ContainerDevice("GPU-a1", "NVIDIA", 5000, 0)]]), NOW)
    packed = gunzip_one_member(await scrape(m, gzipped=True))
    plain = await scrape(m, gzipped=False)
    assert packed == plain
    assert builds == [True, False]  # each kind built again, once
    found = samples(plain)
    assert value(found, "hami_gpu_memory_allocated_bytes", device_uuid="GPU-a1") == 5000 * MIB
    assert value(found, "hami_vgpu_memory_allocated_bytes", pod="p") == 5000 * MIB

    c.delete_node("b")
    found = samples(gunzip_one_member(await scrape(m, gzipped=True)))
    assert all(labels["node"] != "b" for labels, _ in found["hami_gpu_memory_limit_bytes"])
    found = samples(m.render())  # the whole-at-once path reads the same kept text
    assert all(labels["node"] != "b" for labels, _ in found["hami_gpu_memory_limit_bytes"])


async def test_the_worker_reads_a_snapshot_while_the_loop_changes_the_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A change made while the worker builds is not half in that body (the worker reads
    only the snapshot's bytes) and shows in the next scrape."""
    c = cluster()
    two_nodes(c)
    m = SchedulerMetrics(c)
    await scrape(m, gzipped=True)
    c.upsert_pod(running("p", "a", [[ContainerDevice("GPU-a0", "NVIDIA", 1000, 0)]]), NOW)

    started, release = threading.Event(), threading.Event()
    build = metrics._build

    def slow(*args: Any) -> Any:
        started.set()
        assert release.wait(10)
        return build(*args)

    monkeypatch.setattr(metrics, "_build", slow)
    first = asyncio.create_task(scrape(m, gzipped=True))
    await asyncio.to_thread(started.wait, 10)
    # The loop runs on while the worker builds: the pod's memory doubles, a node goes.
    c.upsert_pod(running("p", "a", [[ContainerDevice("GPU-a0", "NVIDIA", 2000, 0)]]), NOW)
    c.delete_node("b")
    second = asyncio.create_task(scrape(m, gzipped=True))  # waits for the first build
    await asyncio.sleep(0.01)
    release.set()
    before, after = (
        samples(gunzip_one_member(await first)),
        samples(gunzip_one_member(await second)),
    )
    assert value(before, "hami_vgpu_memory_allocated_bytes", pod="p") == 1000 * MIB
    assert {labels["node"] for labels, _ in before["hami_gpu_memory_limit_bytes"]} == {"a", "b"}
    assert value(after, "hami_vgpu_memory_allocated_bytes", pod="p") == 2000 * MIB
    assert {labels["node"] for labels, _ in after["hami_gpu_memory_limit_bytes"]} == {"a"}


async def test_a_standby_drops_the_kept_body() -> None:
    c = cluster()
    c.upsert_node(node("a", register(["GPU-a0"], model=MODEL)), NOW)
    m = SchedulerMetrics(c)
    await scrape(m, gzipped=True)
    await scrape(m, gzipped=False)
    m.cluster_gauges = False
    found = samples(await scrape(m, gzipped=False))
    assert "hami_gpu_memory_limit_bytes" not in found
    assert m.cluster_text._packed is None and m.cluster_text._plain is None
    m.cluster_gauges = True
    found = samples(gunzip_one_member(await scrape(m, gzipped=True)))
    assert value(found, "hami_gpu_memory_limit_bytes", device_uuid="GPU-a0") == 32768 * MIB
