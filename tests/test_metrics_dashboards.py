"""Every query of the shipped Grafana dashboards, of Go HAMi's own dashboard
(``dashboards/hami-vgpu-dashboard.json``, Grafana.com 21833) and HAMi-WebUI's queries of
HAMi's series names series that a real scheduler role and a real node agent export, with
the labels the query uses.

A scheduler role and a node agent (NVIDIA backend on a fake NVML, kubelet emulator) run
against the real API server; a placed pod (annotations as a bind writes them), a
ResourceQuota and a refused filter call give every scheduler family its samples, and a
HAMi-core region file of a pod on the agent's node gives the usage monitor's. Both ``/metrics`` are
scraped over HTTP (the scheduler's gzip-compressed, as Prometheus asks) and parsed with
prometheus_client's parser. A query's label names are those of its matchers
(``{node=~"$node"}``), of its grouping and matching clauses (``by``, ``on``, ...: checked
on every series of the query) and of ``label_values(series, label)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from _monitor_helpers import Proc, RegionSpec, write_region
from _nvml_helpers import FakeGpu, FakeNvml, Handle
from _sched_helpers import scheduler_config
from prometheus_client.parser import text_string_to_metric_families

from hami import config, log
from hami.backends.base import BackendSettings
from hami.backends.nvidia import NvidiaBackend
from hami.kube.client import Kube
from hami.node import NodeAgent
from hami.protocol import ContainerDevice, encode_pod_devices
from hami.scheduler.role import SchedulerRole
from hami.testkit.cluster import poll

ROOT = Path(__file__).resolve().parent.parent
OURS = sorted((ROOT / "charts" / "hami" / "dashboards").glob("*.json"))
GO_COMMIT = "4707fb02c91c545bc7343ce26dba4c32919f9a3e"  # Go HAMi v2.10, as test_go_vectors pins
GO_DASHBOARD = Path("dashboards") / "hami-vgpu-dashboard.json"
# What Go HAMi's dashboard reads (v2.10), for when its source tree is not at hand.
GO_USES = (
    ("hami_gpu_memory_limit_bytes", ("node", "device_uuid")),
    ("hami_gpu_memory_allocated_bytes", ("node",)),
    ("hami_gpu_shared_count", ("node",)),
    ("hami_node_gpu_memory_allocated_ratio", ("node",)),
    ("hami_gpu_core_allocated_ratio", ("node",)),
    ("hami_host_gpu_memory_used_bytes", ("device_uuid",)),
    ("hami_host_gpu_utilization_ratio", ("device_uuid",)),
    ("hami_vgpu_memory_used_bytes", ("namespace",)),
    ("hami_vgpu_memory_limit_bytes", ("namespace",)),
    ("hami_container_device_utilization_ratio", ("namespace",)),
)
# What HAMi-WebUI's server queries of HAMi's series (its exporter, server/internal/exporter;
# its other hami_* names are its own exporter's, not HAMi's).
WEBUI_USES = (
    ("hami_container_device_utilization_ratio", ("device_uuid", "namespace", "pod", "container")),
    ("hami_vgpu_memory_used_bytes", ("device_uuid", "namespace", "pod", "container")),
)
GPU0 = "GPU-dddddddd-0000-0000-0000-000000000000"
GIB = 2**30

SELECTOR = re.compile(r"\b(hami_[A-Za-z0-9_:]*)\s*(?:\{([^}]*)\})?")
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\(\s*(hami_\w+)\s*(?:\{[^}]*\})?\s*,\s*(\w+)\s*\)")
RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")


class UtilNvml(FakeNvml):
    """The fake NVML with utilization rates (the host series)."""

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        return SimpleNamespace(gpu=40, memory=10)


@pytest.fixture(autouse=True)
def _logging_to_real_stderr() -> None:
    """Another test's cli.main may have pointed logging at a capture stream closed since."""
    log.configure("info", "console", stream=sys.__stderr__)


@dataclass(frozen=True)
class Use:
    """One series a dashboard query reads, and the label names it uses on it."""

    where: str  # dashboard: panel or variable, for the failure message
    query: str
    series: str
    labels: frozenset[str]


def uses_of(query: str, where: str) -> Iterator[Use]:
    grouping = {
        label.strip()
        for clause in GROUPING.findall(query)
        for label in clause.split(",")
        if label.strip()
    }
    for name, label in LABEL_VALUES.findall(query):
        yield Use(where, query, name, frozenset({label}))
    if LABEL_VALUES.search(query):
        return
    for name, matchers in SELECTOR.findall(query):
        labels = set(MATCHER.findall(matchers)) | grouping
        yield Use(where, query, name, frozenset(labels))


def queries(board: Any, title: str) -> Iterator[tuple[str, str]]:
    """(where, query) of every panel target and templating variable of a dashboard."""

    def walk(node: Any, where: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, dict):
            here = f"{where} / {node['title']}" if isinstance(node.get("title"), str) else where
            for key in ("expr", "definition"):
                if isinstance(node.get(key), str) and node[key]:
                    yield here, node[key]
            for key, value in node.items():
                if key not in ("expr", "definition"):
                    yield from walk(value, here)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item, where)

    yield from walk(board.get("panels", []), title)
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if variable.get("type") == "query" and isinstance(query, str):
            yield f"{title} / ${variable.get('name')}", query


def go_dashboard() -> Path | None:
    for base in (
        os.environ.get("HAMI_SRC"),
        str(Path.home() / ".cache" / "hami" / "hami-src" / GO_COMMIT),
    ):
        if base and (Path(base) / GO_DASHBOARD).is_file():
            return Path(base) / GO_DASHBOARD
    return None


def all_uses() -> list[Use]:
    found: list[Use] = []
    for path in OURS:
        board = json.loads(path.read_text())
        for where, query in queries(board, path.name):
            found.extend(uses_of(query, where))
    go = go_dashboard()
    if go is not None:
        for where, query in queries(json.loads(go.read_text()), "Go HAMi " + go.name):
            found.extend(uses_of(query, where))
    else:
        found.extend(
            Use("Go HAMi (kept list)", name, name, frozenset(labels)) for name, labels in GO_USES
        )
    found.extend(
        Use("HAMi-WebUI (kept list)", name, name, frozenset(labels)) for name, labels in WEBUI_USES
    )
    return found


def test_dashboards_are_shipped_and_read_by_the_checker() -> None:
    names = {path.name for path in OURS}
    assert {"hami-scheduler.json", "hami-node.json"} <= names
    uses = all_uses()
    for path in OURS:
        board = json.loads(path.read_text())
        assert board["uid"] and board["title"] and board["panels"]
        assert any(use.where.startswith(path.name) for use in uses), path.name
    # The checker sees what a query says (a regression in it would pass everything).
    sample = list(
        uses_of('sum by (node) (hami_a{zone="vGPU", x=~"$x"}) and on (device_uuid) hami_b', "t")
    )
    assert [(u.series, set(u.labels)) for u in sample] == [
        ("hami_a", {"zone", "x", "node", "device_uuid"}),
        ("hami_b", {"node", "device_uuid"}),
    ]
    assert [(u.series, set(u.labels)) for u in uses_of("label_values(hami_c, node)", "t")] == [
        ("hami_c", {"node"})
    ]


def exposition_labels(text: str) -> dict[str, set[str]]:
    """sample name -> union of the label names of its samples."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


async def get(url: str) -> str:
    # aiohttp asks for gzip and inflates it, as Prometheus does.
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        return await resp.text()


@contextlib.asynccontextmanager
async def both_roles(
    kube: Kube, namespace: str, kubelet_factory: Any, tmp: Path
) -> AsyncIterator[dict[str, set[str]]]:
    """A scheduler role and a node agent with samples in every family; the label names
    of both scrapes together (one Prometheus data source sees both)."""
    cfg = scheduler_config(handshake_period="1s")
    suffix = uuid.uuid4().hex[:6]
    node = f"dash-{suffix}"
    ghost = f"ghost-{suffix}"  # the placed pod's node: no kubelet runs it
    async with SchedulerRole(cfg, kube) as role:
        await role.wait_ready()
        kubelet = await kubelet_factory(node)
        containers = tmp / "containers"
        containers.mkdir()
        backend = NvidiaBackend(
            BackendSettings(
                options={
                    "sysfs_root": str(tmp / "sys"),
                    "health_checks": False,
                    "topology_score": False,
                    "hamicore": {"containers_dir": str(containers)},
                }
            ),
            nvml=UtilNvml([FakeGpu(0, GPU0, "A100-SXM4-40GB", 40 * GIB, "0000:3b:00.0")]),
        )
        agent = NodeAgent(
            config.from_mapping({"node": {"monitor": {"scan_period": "200ms"}}}),
            node_name=node,
            kube=kube,
            backends={"nvidia": backend},
            register_period=0.5,
            device_plugin_dir=str(kubelet.plugin_dir),
            http_address="127.0.0.1",
            http_port=0,
            kubelet_poll=0.2,
        )
        task = asyncio.create_task(agent.run())
        try:
            await agent.wait_ready(30)
            await kube.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/resourcequotas",
                body={
                    "apiVersion": "v1",
                    "kind": "ResourceQuota",
                    "metadata": {"name": "gpu"},
                    "spec": {"hard": {"limits.nvidia.com/gpumem": "8000"}},
                },
            )
            devices = [[ContainerDevice(GPU0, "NVIDIA", 3000, 20)]]
            limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}
            await kube.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods",
                body={
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": "placed",
                        "annotations": {
                            "hami.io/vgpu-node": ghost,
                            "hami.io/vgpu-devices-allocated": encode_pod_devices(devices),
                            "hami.io/bind-phase": "success",
                        },
                    },
                    "spec": {
                        "nodeName": ghost,
                        "containers": [
                            {"name": "c", "image": "busybox", "resources": {"limits": limits}}
                        ],
                    },
                },
            )
            # A container on the agent's node with a HAMi-core region: the usage series.
            running = await kube.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods",
                body={
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "running"},
                    "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]},
                },
            )
            region = RegionSpec(
                uuids=(GPU0,),
                limits=(4 * GIB,),
                procs=(Proc(memory={0: (100, 200, 300, 0, 600)}, sm_util={0: 35}),),
                last_kernel_time=int(time.time()) - 5,
            )
            write_region(containers, running["metadata"]["uid"], "main", region)
            scheduler_url = f"{role.probe_url}/metrics"
            node_url = f"http://127.0.0.1:{agent.http_port}/metrics"

            async def scheduler_has_all() -> bool:
                text = await get(scheduler_url)
                return (
                    f'hami_node_available{{node="{node}",type="nvidia"}} 1.0' in text
                    and "hami_vgpu_memory_allocated_bytes{" in text
                    and "hami_resource_quota_limit{" in text
                )

            await poll(scheduler_has_all, 30, "the node, the pod and the quota in /metrics")

            async def node_has_all() -> bool:
                text = await get(node_url)
                return all(
                    f"{name}{{" in text
                    for name in (
                        "hami_host_gpu_memory_used_bytes",
                        "hami_vgpu_memory_used_bytes",
                        "hami_container_last_kernel_elapsed_seconds",
                    )
                )

            await poll(node_has_all, 30, "the usage monitor's series in the agent's /metrics")
            # A refused filter call: the rejection counter gets its first sample.
            too_big = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "99999"}
            args = {
                "Pod": {
                    "metadata": {"name": "big", "namespace": namespace, "uid": "uid-big"},
                    "spec": {
                        "containers": [{"name": "c", "resources": {"limits": too_big}}],
                    },
                },
                "NodeNames": [node],
            }
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{role.url}/filter", json=args) as resp,
            ):
                answer = await resp.json()
            assert answer["NodeNames"] in (None, []), answer
            found = exposition_labels(await get(scheduler_url))
            for name, labels in exposition_labels(await get(node_url)).items():
                found.setdefault(name, set()).update(labels)
            yield found
        finally:
            await agent.stop()
            await task


def problems(uses: list[Use], found: dict[str, set[str]]) -> list[str]:
    out = []
    for use in uses:
        if use.series not in found:
            out.append(f"{use.where}: {use.series} is not exported ({use.query})")
            continue
        missing = use.labels - found[use.series]
        if missing:
            out.append(
                f"{use.where}: {use.series} has no label {sorted(missing)} "
                f"(it has {sorted(found[use.series])}; query {use.query})"
            )
    return out


@pytest.fixture
def tmp_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_dashboard_queries_name_exported_series_and_labels(
    kube: Kube, namespace: str, kubelet_factory: Any, tmp_dir: Path
) -> None:
    uses = all_uses()
    for needed in ("hami_gpu_memory_limit_bytes", "hami_host_gpu_memory_used_bytes"):
        assert any(use.series == needed for use in uses), needed
    async with both_roles(kube, namespace, kubelet_factory, tmp_dir) as found:
        assert problems(uses, found) == []
