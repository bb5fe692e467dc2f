"""``hami explain`` for a pod waiting on DRA claims, on the real control plane (issue 22
item 6): kube-scheduler alone (DRA mode, no extender) leaves a pod whose claim no node can
meet Pending with its generic "cannot allocate all claims"; ``hami explain`` reads the
claims and the ResourceSlices from the API server and names each node, device and
shortfall.

    ex-a100  2 x NVIDIA-A100-SXM4-40GB  40960 MiB, each holding 30000 MiB of a running pod
    ex-t4    1 x NVIDIA-Tesla T4        15360 MiB

A 20000 MiB claim fits nowhere: 10960 MiB are free on each A100, the T4 has 15360 in all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from _sched_helpers import FakeClock, running_scheduler

from hami import cli, log
from hami.kube.raw import KubeError
from hami.scheduler import draexplain
from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, phase_of, poll
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import claim_template, dra_pod, templates_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

A100, T4 = "ex-a100", "ex-t4"
NODES = (
    NodeSpec(A100, ({"count": 2, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},)),
    NodeSpec(T4, ({"count": 1, "model": "NVIDIA-Tesla T4", "memory": 15360},)),
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(
        NODES, plane=controlplane, timing=Timing(handshake_timeout=3.0), mode="dra"
    ) as c:
        yield c


async def failed_scheduling(cluster: LocalCluster, name: str) -> str:
    found: dict[str, str] = {}

    async def seen() -> bool:
        for event in await cluster.events(name):
            if event.get("reason") == "FailedScheduling":
                found["message"] = str(event.get("message") or "")
        return bool(found)

    await poll(seen, 60, f"FailedScheduling for {name}")
    return found["message"]


async def test_explain_names_node_device_and_shortfall(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # cli.main would point logging at capsys' stream, which closes after this test
    monkeypatch.setattr(log, "configure", lambda *args, **kwargs: None)
    for body in (
        claim_template("two-30000", count=2, mem=30000),
        claim_template("t20000", mem=20000),
    ):
        await cluster.kube.create(templates_path(cluster.namespace), body)
    await cluster.create_pod(dra_pod("filler", ["two-30000"]))
    filler = await cluster.wait_pod("filler", timeout=60)
    assert phase_of(filler) == "Running" and filler["spec"]["nodeName"] == A100
    await cluster.create_pod(dra_pod("waits", ["t20000"]))
    message = await failed_scheduling(cluster, "waits")
    assert "cannot allocate all claims" in message  # all kube-scheduler says

    pod = await cluster.get_pod("waits")
    assert phase_of(pod) == "Pending" and not pod["spec"].get("nodeName")

    async def claim_made() -> bool:
        statuses = (await cluster.get_pod("waits")).get("status", {}).get("resourceClaimStatuses")
        return bool(statuses)

    await poll(claim_made, 30, "the pod's claim made from its template")
    pod = await cluster.get_pod("waits")
    (status,) = pod["status"]["resourceClaimStatuses"]
    label = f"claim {status['resourceClaimName']} request 'gpu'"
    a100_uuids, (t4_uuid,) = cluster.nodes[A100].uuids, cluster.nodes[T4].uuids

    # the function the role's /explain and the CLI call, against the API server
    answer = await draexplain.explain(cluster.kube, pod)
    assert answer is not None
    assert answer["error"] == "" and answer["mode"] == "dra"
    assert answer["requests"] == [label]
    assert answer["details"][A100] == [
        f"{uuid} has 10960 MiB free, {label} asks 20000 MiB" for uuid in a100_uuids
    ]
    assert answer["details"][T4] == [f"{t4_uuid} has 15360 MiB in all, {label} asks 20000 MiB"]
    assert "cannot allocate all claims" in answer["scheduler_message"]

    # the command, computing from the API server (no scheduler role in DRA mode)
    argv = ["explain", "waits", "-n", cluster.namespace, "--kubeconfig", str(cluster.kubeconfig)]
    code = await asyncio.to_thread(cli.main, [*argv, "--offline", "--json"])
    out = capsys.readouterr().out
    # the cluster's own tasks log to stdout too (structlog's default)
    printed: dict[str, Any] = json.loads(out[out.index("{\n") :])
    assert code == 0
    assert printed["details"][A100] == answer["details"][A100]
    assert printed["nodes"][T4] == f"{t4_uuid} has 15360 MiB in all, {label} asks 20000 MiB"
    code = await asyncio.to_thread(cli.main, [*argv, "--offline"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    row = next(line for line in lines if line.startswith(T4))
    assert row.split(None, 1)[1] == f"{t4_uuid} has 15360 MiB in all, {label} asks 20000 MiB"
    assert any(line.startswith("kube-scheduler says: ") for line in lines)

    # a running scheduler role answers the same at its /explain (the command's first try)
    async with running_scheduler(cluster.kube, FakeClock()) as role:
        code = await asyncio.to_thread(
            cli.main, ["explain", "waits", "-n", cluster.namespace, "--url", role.url, "--json"]
        )
        out = capsys.readouterr().out
    online: dict[str, Any] = json.loads(out[out.index("{\n") :])
    assert code == 0
    assert online["details"] == answer["details"]

    # a placed pod: its claim is allocated on its node, the other node cannot take it
    placed = await draexplain.explain(cluster.kube, filler)
    assert placed is not None and placed["assigned"] == A100
    assert placed["nodes"][A100] == "fits"
    assert placed["nodes"][T4].endswith(
        f"is allocated on node {A100} (nvidia-0, nvidia-1): the pod can only go there"
    )


async def ensure(cluster: LocalCluster, body: dict[str, Any]) -> None:
    """Create a template or pod unless an earlier test did."""
    try:
        if body["kind"] == "Pod":
            await cluster.create_pod(body)
        else:
            await cluster.kube.create(templates_path(cluster.namespace), body)
    except KubeError as exc:
        if exc.status != 409:
            raise


async def verdict(cluster: LocalCluster, name: str) -> dict[str, Any]:
    """explain's answer once the pod's claim exists and kube-scheduler gave up on it."""
    await failed_scheduling(cluster, name)

    async def made() -> bool:
        pod = await cluster.get_pod(name)
        return bool((pod.get("status") or {}).get("resourceClaimStatuses"))

    await poll(made, 30, f"{name}'s claim")
    answer = await draexplain.explain(cluster.kube, await cluster.get_pod(name))
    assert answer is not None and answer["error"] == "", answer
    return answer


async def test_explain_agrees_with_kube_schedulers_allocator(cluster: LocalCluster) -> None:
    """Where hami says no node fits, kube-scheduler leaves the pod Pending; where it says
    one fits, kube-scheduler places the pod there: each reason checked against the real
    allocator, not only against this project's reading of it."""
    await ensure(cluster, claim_template("two-30000", count=2, mem=30000))
    await ensure(cluster, dra_pod("filler", ["two-30000"]))
    await cluster.wait_pod("filler", timeout=60)
    t4_uuid = cluster.nodes[T4].uuids[0]
    a100_model = "NVIDIA-A100-SXM4-40GB"

    # a T4 model selector and more than a T4 has
    await ensure(cluster, claim_template("t4-16000", mem=16000, model="T4"))
    await ensure(cluster, dra_pod("t4-big", ["t4-16000"]))
    answer = await verdict(cluster, "t4-big")
    label = answer["requests"][0]
    assert answer["details"][T4] == [f"{t4_uuid} has 15360 MiB in all, {label} asks 16000 MiB"]
    assert all(
        line.endswith(f"is a {a100_model}, {label} asks a model containing 't4'")
        for line in answer["details"][A100]
    ), answer["details"][A100]

    # two distinct devices of 12000 MiB: 10960 free on each A100, one T4
    await ensure(cluster, claim_template("two-12000", count=2, mem=12000))
    await ensure(cluster, dra_pod("two-big", ["two-12000"]))
    answer = await verdict(cluster, "two-big")
    label = answer["requests"][0]
    assert answer["details"][T4] == [f"{label} asks 2 devices, 1 can take it"]
    assert len(answer["details"][A100]) == 2

    # no memory named: the whole device; the A100s are shared, the T4 is free
    await ensure(cluster, claim_template("whole"))
    await ensure(cluster, dra_pod("whole-1", ["whole"]))
    placed = await cluster.wait_pod("whole-1", timeout=60)
    assert placed["spec"]["nodeName"] == T4  # the only node explain would call fitting
    await ensure(cluster, dra_pod("whole-2", ["whole"]))
    answer = await verdict(cluster, "whole-2")
    label = answer["requests"][0]
    assert answer["details"][T4] == [
        "every one of the node's 1 hami devices is fully used",
        f"{t4_uuid} has 0 MiB free, {label} asks the whole device (15360 MiB: no memory named)",
    ]
    assert all("asks the whole device (40960 MiB" in line for line in answer["details"][A100][-2:])
    assert "fits" not in answer["nodes"].values()


async def test_explain_names_a_device_taint_kube_scheduler_respects(cluster: LocalCluster) -> None:
    """A tainted device (``resource.k8s.io`` device taints, on by default in 1.36), in a
    pool of its own on ex-t4 (the agent keeps its own slice as it is): kube-scheduler does
    not allocate it to a claim that does not tolerate the taint, and explain names it."""
    path = "/apis/resource.k8s.io/v1/resourceslices"
    (own,) = [s for s in (await cluster.kube.list_all(path))[0] if s["spec"].get("nodeName") == T4]
    device = dict(own["spec"]["devices"][0])
    device["name"] = "nvidia-9"
    device["attributes"] = {
        **device["attributes"],
        "uuid": {"string": "GPU-tainted-9"},
        "model": {"string": "NVIDIA-Tainted X1"},
        "index": {"int": 9},
    }
    device["taints"] = [{"key": "gpu.hami.io/xid", "value": "79", "effect": "NoSchedule"}]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "ex-t4-tainted"},
        "spec": {
            "driver": "nvidia.hami.io",
            "pool": {"name": "ex-t4-tainted", "generation": 0, "resourceSliceCount": 1},
            "nodeName": T4,
            "devices": [device],
        },
    }
    await cluster.kube.create(path, body)
    try:
        await ensure(cluster, claim_template("tainted", mem=1000, model="Tainted"))
        await ensure(cluster, dra_pod("on-tainted", ["tainted"]))
        answer = await verdict(cluster, "on-tainted")
        label = answer["requests"][0]
        pod = await cluster.get_pod("on-tainted")
        assert phase_of(pod) == "Pending" and not pod["spec"].get("nodeName")
        assert answer["details"][T4][-1] == (
            f"GPU-tainted-9 has the taint gpu.hami.io/xid=79:NoSchedule, which {label} "
            "does not tolerate"
        )
        assert "fits" not in answer["nodes"].values()

        # the taint is what holds it: a claim that tolerates it is allocated that device
        # (which the agent then refuses to prepare: not its pool; only the allocation counts)
        tolerant = claim_template("tolerant", mem=1000, model="Tainted")
        exact = tolerant["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        exact["tolerations"] = [{"key": "gpu.hami.io/xid", "operator": "Exists"}]
        await ensure(cluster, tolerant)
        await ensure(cluster, dra_pod("tolerates", ["tolerant"]))
        placed = await cluster.wait_pod("tolerates", lambda p: bool(p["spec"].get("nodeName")))
        assert placed["spec"]["nodeName"] == T4
        answer = await draexplain.explain(cluster.kube, placed)
        assert answer is not None
        assert answer["allocated"][0]["node"] == T4
        assert answer["allocated"][0]["devices"] == ["nvidia-9"]
    finally:
        for name in ("on-tainted", "tolerates"):
            await cluster.delete_pod(name)
        await cluster.kube.delete(f"{path}/ex-t4-tainted")
