"""Pods written for Go HAMi (issue 10 item 7) in the scheduler role on the real control
plane: a topology-aware pod placed by a node's Go-written ``hami.io/node-nvidia-score``, and
a warning Event (never a rejection, once per message) for policy and weights values that
are not understood."""

from __future__ import annotations

from typing import Any

import pytest
from _sched_helpers import (
    FakeClock,
    binding,
    create_node,
    create_pod,
    delete_nodes,
    post,
    running_scheduler,
    unique,
)
from _sched_helpers import gpu_pod as sched_pod
from _sched_helpers import register as sched_register

from hami.core import topology
from hami.kube.client import Kube
from hami.testkit.cluster import poll

POLICY = "hami.io/gpu-scheduler-policy"
WEIGHTS = "hami.io/device-scoring-weights"


# --------------------------------------------------------------------------- control plane


@pytest.mark.controlplane
async def test_scheduler_reads_go_scores_and_warns_about_unknown_policies(
    kube: Kube, namespace: str
) -> None:
    name = unique("topo")
    gpus = [f"GPU-{name}-{i}" for i in range(4)]
    pairs = {(gpus[1], gpus[3]): 1210, (gpus[3], gpus[1]): 1210}
    annotations = {
        "hami.io/node-nvidia-register": sched_register(gpus),
        "hami.io/node-handshake-nvidia": "Reported_2024-05-20 09:59:50",
        "hami.io/node-nvidia-score": topology.encode_pair_scores(gpus, pairs),  # as Go writes
    }
    await create_node(kube, name, annotations)
    try:
        async with running_scheduler(kube, FakeClock()) as role:
            await poll(lambda: name in role.scheduler.cluster.nodes)
            topo = sched_pod("topo", count=2, annotations={POLICY: "spread,topology-aware"})
            topo = await create_pod(kube, namespace, topo)
            answer = await post(f"{role.url}/filter", {"Pod": topo, "NodeNames": [name]})
            assert answer["NodeNames"] == [name], answer
            assert await post(f"{role.url}/bind", binding(topo, name)) == {"Error": ""}
            stored = await kube.get_pod(namespace, "topo")  # bind wrote the decision
            value = stored["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
            assert value == f"{gpus[1]},NVIDIA,3000,0:{gpus[3]},NVIDIA,3000,0:;"

            odd = sched_pod("odd", annotations={POLICY: "fastest", WEIGHTS: "slot=1"})
            odd = await create_pod(kube, namespace, odd)
            for _ in range(2):  # kube-scheduler retries: one Event per message
                answer = await post(f"{role.url}/filter", {"Pod": odd, "NodeNames": [name]})
                assert answer["NodeNames"] == [name], answer
            await role.scheduler.drain()
            events = await kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
            warned = [
                e["message"]
                for e in events["items"]
                if e["involvedObject"]["name"] == "odd" and e["reason"] == "PolicyIgnored"
            ]
            # only the warnings: success Events are off by default (scheduler.success_events)
            assert e_type(events, "odd") == {"Warning"}
            assert len(warned) == 2, warned
            assert any("'fastest'" in m for m in warned)
            assert any(WEIGHTS in m for m in warned)
    finally:
        await delete_nodes(kube, [name])


def e_type(events: dict[str, Any], pod_name: str) -> set[str]:
    return {e["type"] for e in events["items"] if e["involvedObject"]["name"] == pod_name}
