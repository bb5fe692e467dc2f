"""Namespace device quotas end to end on the real control plane: the scheduler role
watches ResourceQuotas, /filter refuses a pod over quota with ``QuotaExceeded``, freeing a
pod lets the next one in, and /explain and /metrics show used and limit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from _manifest_helpers import apply, documents
from _sched_helpers import (
    FakeClock,
    create_node,
    create_pod,
    delete_nodes,
    gpu_pod,
    post,
    register,
    running_scheduler,
    scheduler_config,
    unique,
)

from hami import cli, log
from hami.core.quota import QuotaStatus
from hami.kube.client import Kube, open_client
from hami.scheduler.role import SchedulerRole
from hami.testkit.cluster import poll

REPORTED = "Reported_2024-05-20 09:59:50"
KUBE_SCHEDULER_CONFIG = Path(__file__).resolve().parent.parent / "config" / "kube-scheduler.yaml"
MEM = "nvidia.com/gpumem"
SCHEDULER_SA = "system:serviceaccount:hami-system:hami-scheduler"


async def make_nodes(kube: Kube, prefix: str) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(2)]
    for name in names:
        await create_node(
            kube,
            name,
            {
                "hami.io/node-nvidia-register": register([f"GPU-{name}-0", f"GPU-{name}-1"]),
                "hami.io/node-handshake-nvidia": REPORTED,
            },
        )
    return names


def quotas_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/resourcequotas"


async def set_quota(kube: Kube, namespace: str, hard: dict[str, str]) -> None:
    body = {"metadata": {"name": "gpu"}, "spec": {"hard": hard}}
    try:
        current = await kube.request("GET", f"{quotas_path(namespace)}/gpu")
    except Exception:
        await kube.create(quotas_path(namespace), body)
    else:
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await kube.request("PUT", f"{quotas_path(namespace)}/gpu", body=body)


def limit_of(rows: list[QuotaStatus]) -> int | None:
    return next((row.limit for row in rows if row.resource.name == MEM), None)


async def filter_pod(role: SchedulerRole, pod: dict[str, Any], nodes: list[str]) -> dict:
    return await post(f"{role.url}/filter", {"Pod": pod, "NodeNames": nodes})


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        return await resp.text()


async def get_json(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        data: dict[str, Any] = await resp.json()
        return data


async def test_pods_are_placed_until_the_quota_is_reached(kube: Kube, namespace: str) -> None:
    nodes = await make_nodes(kube, unique("quota"))
    await set_quota(kube, namespace, {f"limits.{MEM}": "8000", "limits.nvidia.com/gpucores": "90"})
    try:
        async with running_scheduler(kube, FakeClock()) as role:
            quotas = role.scheduler.cluster.quotas
            await poll(lambda: bool(quotas.status(namespace)))
            placed = []
            for name in ("p1", "p2"):
                pod = await create_pod(kube, namespace, gpu_pod(name, mem=3000, cores=30))
                answer = await filter_pod(role, pod, nodes)
                assert answer["Error"] == "" and len(answer["NodeNames"]) == 1, answer
                placed.append(pod)
            assert quotas.used(namespace) == {MEM: 6000, "nvidia.com/gpucores": 60}

            # 3000 more would make 9000 of 8000: every node says QuotaExceeded
            p3 = await create_pod(kube, namespace, gpu_pod("p3", mem=3000, cores=30))
            answer = await filter_pod(role, p3, nodes)
            assert answer["NodeNames"] == []
            assert set(answer["FailedNodes"]) == set(nodes)
            reason = answer["FailedNodes"][nodes[0]]
            assert reason.startswith(f"QuotaExceeded: namespace {namespace} has 6000MiB")
            assert "ResourceQuota gpu allows 8000MiB" in reason

            explained = await get_json(f"{role.url}/explain?namespace={namespace}&name=p3")
            assert explained["quota"][MEM] == {
                "used": 6000,
                "limit": 8000,
                "unit": "MiB",
                "quota": "gpu",
            }
            # explain covers every node the scheduler knows; other tests' nodes may share
            # the control plane, so only this test's nodes are judged
            assert all(explained["nodes"][n].startswith("QuotaExceeded") for n in nodes)
            metrics = await get_text(f"{role.probe_url}/metrics")
            labels = f'namespace="{namespace}",quota_name="{MEM}"'
            assert f'hami_resource_quota_used{{limit="8000",{labels}}} 6000.0' in metrics
            assert f"hami_resource_quota_limit{{{labels}}} 8000.0" in metrics
            assert 'hami_filter_node_rejections_total{reason="QuotaExceeded"} 2.0' in metrics

            # the pod watch frees p1's hold when it is deleted: p3 fits again
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/p1", {"gracePeriodSeconds": 0})
            await poll(lambda: quotas.used(namespace).get(MEM) == 3000)
            answer = await filter_pod(role, p3, nodes)
            assert answer["Error"] == "" and len(answer["NodeNames"]) == 1, answer

            # a quota lowered to an explicit 0 blocks the next pod; deleted, it limits nothing
            await set_quota(kube, namespace, {f"limits.{MEM}": "0"})
            await poll(lambda: limit_of(quotas.status(namespace)) == 0)
            p4 = await create_pod(kube, namespace, gpu_pod("p4", mem=100))
            answer = await filter_pod(role, p4, nodes)
            assert answer["FailedNodes"][nodes[0]].startswith("QuotaExceeded"), answer
            await kube.delete(f"{quotas_path(namespace)}/gpu")
            await poll(lambda: all(r.limit is None for r in quotas.status(namespace)))
            answer = await filter_pod(role, p4, nodes)
            assert answer["Error"] == "" and len(answer["NodeNames"]) == 1, answer
    finally:
        await delete_nodes(kube, nodes)


async def test_two_pods_racing_for_the_last_quota(kube: Kube, namespace: str) -> None:
    nodes = await make_nodes(kube, unique("race"))
    await set_quota(kube, namespace, {f"limits.{MEM}": "5000"})
    try:
        async with running_scheduler(kube, FakeClock()) as role:
            quotas = role.scheduler.cluster.quotas
            await poll(lambda: bool(quotas.status(namespace)))
            pods = [await create_pod(kube, namespace, gpu_pod(f"r{i}", mem=3000)) for i in range(2)]
            answers = await asyncio.gather(*(filter_pod(role, pod, nodes) for pod in pods))
            placed = [a for a in answers if a["NodeNames"]]
            refused = [a for a in answers if not a["NodeNames"]]
            assert len(placed) == 1 and len(refused) == 1, answers
            assert all(r.startswith("QuotaExceeded") for r in refused[0]["FailedNodes"].values())
            assert quotas.used(namespace) == {MEM: 3000}
    finally:
        await delete_nodes(kube, nodes)


@contextlib.asynccontextmanager
async def as_scheduler_account(controlplane: Any, kube: Kube) -> AsyncIterator[Kube]:
    """A client acting as the scheduler's service account, with the manifests' RBAC."""
    for doc in documents("00-*.yaml") + documents("10-*.yaml"):
        await apply(kube, doc)
    async with open_client(controlplane.kubeconfig) as client:
        client.api.set_default_header("Impersonate-User", SCHEDULER_SA)
        yield client


async def test_the_manifests_let_the_scheduler_watch_quotas(
    controlplane: Any, kube: Kube, namespace: str
) -> None:
    await set_quota(kube, namespace, {f"limits.{MEM}": "1000"})
    async with (
        as_scheduler_account(controlplane, kube) as account,
        running_scheduler(account, FakeClock()) as role,
    ):
        assert role.not_ready() is None
        await poll(lambda: bool(role.scheduler.cluster.quotas.status(namespace)))


async def test_hami_explain_offline_prints_used_and_limit(
    kube: Kube,
    namespace: str,
    kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(log, "configure", lambda *args, **kwargs: None)
    nodes = await make_nodes(kube, unique("qx"))
    await set_quota(kube, namespace, {f"limits.{MEM}": "4000"})
    try:
        # a pod already placed (its annotations are what the offline answer counts) ...
        held = gpu_pod("held", mem=3000)
        held["metadata"]["annotations"] = {
            "hami.io/vgpu-node": nodes[0],
            "hami.io/vgpu-devices-allocated": f"GPU-{nodes[0]}-0,NVIDIA,3000,0:;",
        }
        held["spec"]["nodeName"] = nodes[0]
        await create_pod(kube, namespace, held)
        # ... and one that would go over
        await create_pod(kube, namespace, gpu_pod("next", mem=2000))
        argv = ["explain", "next", "-n", namespace, "--offline", "--kubeconfig", str(kubeconfig)]
        code = await asyncio.to_thread(cli.main, argv)
        out = capsys.readouterr().out
        assert code == 0
        for name in nodes:
            row = next(line for line in out.splitlines() if line.startswith(name))
            assert row.split(None, 1)[1].startswith("QuotaExceeded: namespace")
        assert f"quota {namespace} {MEM}: 3000MiB used of 4000MiB (ResourceQuota gpu)" in out
    finally:
        await delete_nodes(kube, nodes)


async def test_kube_scheduler_holds_a_pod_over_quota_until_one_is_freed(
    kube: Kube, namespace: str, kube_scheduler: Any, kubelet_factory: Any
) -> None:
    """The whole path: kube-scheduler, hami as its extender, kubelet emulators."""
    names = [unique("qk-a"), unique("qk-b")]
    for name in names:
        await kubelet_factory(name)
        await kube.patch_node_annotations(
            name,
            {
                "hami.io/node-nvidia-register": register([f"GPU-{name}"], memory=40000),
                "hami.io/node-handshake-nvidia": REPORTED,
            },
        )
    await set_quota(kube, namespace, {f"limits.{MEM}": "8000"})
    # No node agent answers Allocate here, so a node stays locked by its first pod: spread
    # puts a and b on their own nodes, and c, once a is gone, on a's (its lock taken over).
    cfg = scheduler_config(node_policy="spread")
    async with running_scheduler(kube, FakeClock(), cfg) as role:
        config = yaml.safe_load(KUBE_SCHEDULER_CONFIG.read_text())
        config["extenders"][0]["urlPrefix"] = role.url
        await kube_scheduler(config)
        cluster = role.scheduler.cluster
        await poll(lambda: all(n in cluster.nodes and cluster.nodes[n].types for n in names))
        await poll(lambda: bool(cluster.quotas.status(namespace)))

        async def node_of(name: str) -> str | None:
            pod = await kube.get_pod(namespace, name)
            return pod["spec"].get("nodeName")

        for name in ("a", "b"):
            await create_pod(kube, namespace, gpu_pod(name, mem=4000))
            await poll(lambda name=name: node_of(name), 30, f"pod {name} bound")
        await create_pod(kube, namespace, gpu_pod("c", mem=4000))

        async def refused() -> bool:
            pod = await kube.get_pod(namespace, "c")
            conditions = (pod.get("status") or {}).get("conditions") or []
            return any("QuotaExceeded" in (c.get("message") or "") for c in conditions)

        await poll(refused, 30, "pod c reported QuotaExceeded")
        assert await node_of("c") is None
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/a", {"gracePeriodSeconds": 0})
        await poll(lambda: f"{namespace}/a" not in cluster.pods, 10, "a's hold freed")
        # kube-scheduler retries a pod an extender refused on its next cluster event (or
        # after 5 min); a's deletion is one, but it may retry c before hami has seen it, and
        # this quiet test cluster has no other: any later event does it, here a label.
        path = f"/api/v1/namespaces/{namespace}/pods/c"
        await kube.merge_patch(path, {"metadata": {"labels": {"nudge": "1"}}})
        await poll(lambda: node_of("c"), 30, "pod c bound once a is gone")
        assert cluster.quotas.used(namespace) == {MEM: 8000}
