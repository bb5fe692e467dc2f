"""``hami explain`` for a pod Pending for a reason outside hami, and for a placed pod."""

from __future__ import annotations

import pytest
from _sched_helpers import (
    FakeClock,
    create_node,
    create_pod,
    delete_nodes,
    gpu_pod,
    register,
    running_scheduler,
    unique,
)

from hami.kube.client import Kube
from hami.scheduler import explain_cli
from hami.testkit.cluster import poll

REPORTED = "Reported_2024-05-20 09:59:50"


def _annotations(node: str, memory: int) -> dict[str, str]:
    return {
        "hami.io/node-nvidia-register": register([f"GPU-{node}"], memory=memory, count=1),
        "hami.io/node-handshake-nvidia": REPORTED,
    }


async def test_a_placed_pod_is_not_held_against_its_own_node(kube: Kube, namespace: str) -> None:
    node = unique("own")
    await create_node(kube, node, _annotations(node, 8000))
    try:
        pod = await create_pod(kube, namespace, gpu_pod("whole", mem=8000))
        async with running_scheduler(kube, FakeClock()) as role:
            await poll(lambda: node in role.scheduler.cluster.nodes)
            result = await role.scheduler.filter({"Pod": pod, "NodeNames": [node]})
            assert result["NodeNames"] == [node], result
            answer = await role.scheduler.explain(namespace, "whole")
            # (other tests' nodes may share the control plane: judge this one)
            assert answer["nodes"][node] == "fits", answer
            # the hold is still there for every other pod
            other = await create_pod(kube, namespace, gpu_pod("other", mem=8000))
            assert role.scheduler.explain_pod(other)["nodes"][node] != "fits"
    finally:
        await delete_nodes(kube, [node])


async def test_pending_outside_hami_shows_kube_schedulers_message(
    kube: Kube, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node = unique("taint")
    await create_node(kube, node, _annotations(node, 40000))
    message = f"0/1 nodes are available: 1 node(s) had untolerated taint {{{node}: x}}."
    try:
        pod = await create_pod(kube, namespace, gpu_pod("tainted", mem=1000))
        for n, text in enumerate(["an older message", message]):
            await _failed_scheduling(kube, namespace, pod, text, n)
        async with running_scheduler(kube, FakeClock()) as role:
            await poll(lambda: node in role.scheduler.cluster.nodes)
            answer = await role.scheduler.explain(namespace, "tainted")
        assert answer["scheduler_message"] == message
        explain_cli.print_answer(answer)
        out = capsys.readouterr().out
        assert message in out
        assert not [line for line in out.splitlines() if line.endswith("  fits")]
    finally:
        await delete_nodes(kube, [node])


async def _failed_scheduling(
    kube: Kube, namespace: str, pod: dict[str, object], text: str, n: int
) -> None:
    meta = pod["metadata"]
    assert isinstance(meta, dict)
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{n}", "namespace": namespace},
        "involvedObject": {
            "kind": "Pod",
            "namespace": namespace,
            "name": meta["name"],
            "uid": meta["uid"],
        },
        "reason": "FailedScheduling",
        "message": text,
        "type": "Warning",
        "source": {"component": "default-scheduler"},
        "firstTimestamp": f"2026-01-01T00:00:0{n}Z",
        "lastTimestamp": f"2026-01-01T00:00:0{n}Z",
        "count": 1,
    }
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
