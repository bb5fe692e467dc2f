"""The DRA mode's node score on the real control plane (issue 21): kube-scheduler allocates
the claims itself and asks hami's scheduler role only to rank the nodes
(``LocalCluster(mode="dra", dra_score=True)``: an extender with ``prioritizeVerb`` only).

Two nodes of one 40 GiB A100 each. A whole-device pod passes first (so the workload the
defrag policy weighs against has a whole-device shape in it) and goes; then pod ``x``
takes half of node A's device and half its CPU (pinned there). Pod ``p`` asks for the
other half of a device:

- **with the score**, it goes to node A: on node B it would leave a half-used device
  that no whole-device pod can take, on node A it fills the device already shared;
- **without it**, kube-scheduler's own scoring (the emptier node: NodeResourcesFit
  LeastAllocated, BalancedAllocation) sends it to node B.

So the placement differs only by whether hami was consulted.
"""

from __future__ import annotations

from typing import Any

import pytest

from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, phase_of, poll
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import claim_template, claims_path, dra_pod, templates_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

MODEL = "NVIDIA-A100-SXM4-40GB"


def nodes(tag: str) -> tuple[NodeSpec, NodeSpec]:
    group = ({"count": 1, "model": MODEL, "memory": 40960},)
    return NodeSpec(f"dscore-{tag}-a", group), NodeSpec(f"dscore-{tag}-b", group)


async def run(cluster: LocalCluster, name: str, template: str, **extra: Any) -> str:
    body = dra_pod(name, [template], node_selector=extra.pop("selector", cluster.node_selector))
    if "cpu" in extra:
        body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": extra.pop("cpu")}
    await cluster.create_pod(body)
    pod = await cluster.wait_pod(name, timeout=60)
    assert phase_of(pod) == "Running", pod.get("status")
    return str(pod["spec"]["nodeName"])


async def claims_freed(cluster: LocalCluster) -> None:
    async def freed() -> bool:
        items, _ = await cluster.kube.list_all(claims_path(cluster.namespace))
        return not any((c.get("status") or {}).get("allocation") for c in items)

    await poll(freed, 60, "claims deallocated")


async def place_half_pod(cluster: LocalCluster) -> str:
    """The scenario above; the node pod ``p`` lands on."""
    for template in (
        claim_template("whole", cores=100),
        claim_template("half", mem=20480, cores=50),
    ):
        await cluster.kube.create(templates_path(cluster.namespace), template)
    node_a, _ = cluster.specs
    await run(cluster, "w", "whole")
    await cluster.delete_pods()
    await claims_freed(cluster)
    pinned = {"kubernetes.io/hostname": node_a.name}
    assert await run(cluster, "x", "half", selector=pinned, cpu="16") == node_a.name
    if cluster.role is not None:
        score = cluster.role.dra_score
        assert score is not None
        # x's claim (and only it) is in the score's picture before p is ranked; the
        # control plane is shared with other tests, whose claims on their own nodes the
        # score sees too
        ours = {spec.name for spec in cluster.specs}

        def only_x() -> bool:
            held = [r.node for r in score.cluster.pods.values() if r.node in ours]
            return held == [node_a.name]

        await poll(only_x, 30, "the score sees x's claim")
    return await run(cluster, "p", "half")


def scored(cluster: LocalCluster) -> float:
    assert cluster.role is not None and cluster.role.dra_score is not None
    return float(cluster.role.dra_score.metrics.total.labels("scored")._value.get())


async def test_score_moves_the_pod_to_the_node_that_strands_less(
    controlplane: ControlPlane,
) -> None:
    specs = nodes("on")
    async with LocalCluster(
        specs, plane=controlplane, timing=Timing(handshake_timeout=3.0), mode="dra", dra_score=True
    ) as cluster:
        assert cluster.kube_scheduler is not None
        (extender,) = cluster.kube_scheduler.config["extenders"]
        assert extender["prioritizeVerb"] == "prioritize" and extender["ignorable"] is True
        assert "filterVerb" not in extender and "bindVerb" not in extender
        assert await place_half_pod(cluster) == specs[0].name
        assert scored(cluster) >= 2  # w and p were ranked (x had one feasible node)


async def test_without_the_score_kube_scheduler_takes_the_emptier_node(
    controlplane: ControlPlane,
) -> None:
    specs = nodes("off")
    async with LocalCluster(
        specs, plane=controlplane, timing=Timing(handshake_timeout=3.0), mode="dra"
    ) as cluster:
        assert cluster.role is None
        assert cluster.kube_scheduler is not None
        assert "extenders" not in cluster.kube_scheduler.config
        assert await place_half_pod(cluster) == specs[1].name


async def test_scheduling_goes_on_when_the_score_is_down(controlplane: ControlPlane) -> None:
    """``ignorable: true``: with hami's role stopped kube-scheduler still places DRA pods."""
    async with LocalCluster(
        nodes("down"),
        plane=controlplane,
        timing=Timing(handshake_timeout=3.0),
        mode="dra",
        dra_score=True,
    ) as cluster:
        await cluster.kube.create(
            templates_path(cluster.namespace), claim_template("small", mem=1000)
        )
        await cluster.stop_role()
        node = await run(cluster, "q", "small")
        assert node in {s.name for s in cluster.specs}
