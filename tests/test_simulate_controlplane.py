"""``hami simulate --from-cluster`` on the real control plane (kube-apiserver,
kube-scheduler, node agents with the kubelet emulator): the start is the live cluster's
nodes and running pods, and the trace's pods placed on top never take what a running pod
holds."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from hami import log
from hami.simulate import cli
from hami.testkit.cluster import CLUSTER_LABEL, SCHEDULER_NAME, LocalCluster, NodeSpec, Timing
from hami.testkit.controlplane import ControlPlane

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

NODE = "sim-gpu"
NODES = (NodeSpec(NODE, ({"count": 1, "model": "NVIDIA-Tesla T4", "memory": 15360},)),)
TIMING = Timing(register_period=1.0, handshake_period=1.0, handshake_timeout=3.0)
PODS = Path(__file__).parent / "data" / "openb_sample_pods.csv"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    log.configure("warning", "console", stream=sys.__stderr__)
    async with LocalCluster(NODES, plane=controlplane, timing=TIMING) as c:
        yield c


async def test_from_cluster_places_on_top_of_the_running_pods_hold(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "70", "nvidia.com/gpumem": "10752"}
    spec = {
        "containers": [{"name": "c0", "image": "busybox", "resources": {"limits": limits}}],
        "terminationGracePeriodSeconds": 0,
        "schedulerName": SCHEDULER_NAME,
    }
    metadata = {"name": "held", "labels": {CLUSTER_LABEL: cluster.id}}
    await cluster.create_pod(
        {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    )
    held = (await cluster.wait_running(["held"]))["held"]
    assert held["spec"]["nodeName"] == NODE
    out = tmp_path / "placements.jsonl"
    argv = [
        "--from-cluster",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--pods",
        str(PODS),
        "--order",
        "file",
        "--policy",
        "binpack/binpack",
        "--placements",
        str(out),
    ]
    assert await _run(argv) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len(PODS.read_text().splitlines()) - 1
    given: Counter[int] = Counter()
    for line in lines:
        if line["node"] == NODE:
            for device in line["devices"]:
                given[device["index"]] += device["milli"]
    # the running pod holds 70 % of the node's one GPU: at most 300 milli is left
    assert set(given) <= {0}
    assert 0 < given[0] <= 300


async def _run(argv: list[str]) -> int:
    """The CLI runs its own event loop: off this one's thread."""
    import asyncio

    return await asyncio.to_thread(cli.main, argv)
