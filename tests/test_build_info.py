"""``hami_build_info`` on both roles' ``/metrics``, as Go HAMi exports it (HAMi
pkg/metrics/metrics.go, registered by its scheduler and its vGPU monitor): same name, help
and label names, value 1, this project's version."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
from _core_helpers import NVIDIA
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from hami import __version__, config
from hami.node import http as node_http
from hami.node.metrics import NodeMetrics
from hami.scheduler.http import probe_app
from hami.scheduler.service import Scheduler

# HAMi 4707fb02 pkg/metrics/metrics_test.go: the expected exposition.
GO_HELP = "hami build metadata exposed as labels with a constant value of 1."
GO_LABELS = {"version", "revision", "build_date", "go_version", "compiler", "platform"}


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        return await resp.text()


def _build_info(text: str) -> dict[str, str]:
    families = [f for f in text_string_to_metric_families(text) if f.name == "hami_build_info"]
    assert len(families) == 1, "one hami_build_info family"
    family = families[0]
    assert family.type == "gauge"
    assert family.documentation == GO_HELP
    assert [s.value for s in family.samples] == [1.0]
    sample = family.samples[0]
    assert sample.name == "hami_build_info"
    assert set(sample.labels) == GO_LABELS
    return dict(sample.labels)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> None:
    # What docker/Dockerfile's build arguments set in the image.
    monkeypatch.setenv("HAMI_BUILD_REVISION", "0123abc")
    monkeypatch.setenv("HAMI_BUILD_DATE", "2026-01-11T13:09:22Z")


@pytest.fixture
async def scheduler_url() -> AsyncIterator[tuple[str, Scheduler]]:
    scheduler = Scheduler(config.from_mapping({}, env={}).scheduler, [NVIDIA], None)
    runner = web.AppRunner(probe_app(scheduler))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/metrics", scheduler
    finally:
        await runner.cleanup()


@pytest.mark.usefixtures("built")
async def test_scheduler_exports_build_info(scheduler_url: tuple[str, Scheduler]) -> None:
    url, scheduler = scheduler_url
    labels = _build_info(await _get(url))
    assert labels["version"] == __version__
    assert labels["revision"] == "0123abc"
    assert labels["build_date"] == "2026-01-11T13:09:22Z"
    system, arch = labels["platform"].split("/")
    assert system == sys.platform
    assert arch not in ("x86_64", "aarch64")  # Go's GOARCH words: amd64, arm64
    # A standby replica leaves the cluster gauges out, not its build.
    scheduler.metrics.cluster_gauges = False
    assert _build_info(await _get(url)) == labels


@pytest.mark.usefixtures("built")
async def test_node_exports_build_info() -> None:
    listener, port = await node_http.start(
        node_http.make_app(NodeMetrics(), lambda: {"node": "n"}), "127.0.0.1", 0
    )
    try:
        labels = _build_info(await _get(f"http://127.0.0.1:{port}/metrics"))
    finally:
        await listener.close()
    assert labels["version"] == __version__
    assert labels["revision"] == "0123abc"


def test_unknown_without_build_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAMI_BUILD_REVISION", raising=False)
    monkeypatch.delenv("HAMI_BUILD_DATE", raising=False)
    labels = _build_info(NodeMetrics().render().decode())
    # Go HAMi's words for a build without its ldflags.
    assert (labels["revision"], labels["build_date"]) == ("unknown", "unknown")
