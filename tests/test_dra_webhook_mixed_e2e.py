"""Both device modes on one API server (issue 22 item 1), on the real control plane.

One kube-scheduler whose profile has hami as its extender for HAMi's resources, one node
in the extender mode and one in the DRA mode, hami's webhook in front: the same unchanged
pod spec is scheduled by the extender in a namespace without the label and becomes a claim
kube-scheduler allocates alone in a namespace labelled ``hami.io/device-mode: dra``.

Its own module: a second test-kit DRA cluster alive at the same time would run a second
resourceclaim controller, and two controllers race to make a pod's claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from hami.testkit.cluster import (
    ALLOCATED,
    LocalCluster,
    NodeSpec,
    Timing,
    gpu_pod,
    limits,
    phase_of,
)
from hami.testkit.controlplane import ControlPlane
from hami.testkit.kubelet_dra import claim_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

A100_MODEL = "NVIDIA-A100-SXM4-40GB"
TIMING = Timing(handshake_timeout=3.0)


def hami_pod(cluster: LocalCluster, name: str, containers: list[dict[str, str]]) -> dict[str, Any]:
    pod = gpu_pod(name, containers)
    pod["metadata"]["labels"] = dict(cluster.node_selector)  # the test webhook's selector
    return pod


async def run(
    cluster: LocalCluster, pod: dict[str, Any], namespace: str | None = None
) -> dict[str, Any]:
    await cluster.create_pod(pod, namespace)
    running = await cluster.wait_pod(pod["metadata"]["name"], timeout=60, namespace=namespace)
    assert phase_of(running) == "Running", running.get("status")
    return running


async def the_claim(
    cluster: LocalCluster, pod: Mapping[str, Any], namespace: str
) -> dict[str, Any]:
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim: dict[str, Any] = await cluster.kube.request(
        "GET", claim_path(namespace, status["resourceClaimName"])
    )
    return claim


MIXED = (
    NodeSpec("ext-a100", ({"count": 2, "model": A100_MODEL, "memory": 40960},)),
    NodeSpec("dra-a100", ({"count": 2, "model": A100_MODEL, "memory": 40960},)),
)


async def test_both_modes_on_one_api_server(controlplane: ControlPlane) -> None:
    """One kube-scheduler (hami as its extender for HAMi resources), one extender-mode
    node, one DRA-mode node: the same pod spec goes through the extender in the default
    namespace and becomes a claim in a namespace labelled hami.io/device-mode=dra."""
    async with LocalCluster(
        MIXED, plane=controlplane, timing=TIMING, webhook=True, dra_nodes=["dra-a100"]
    ) as mixed:
        dra_ns = f"{mixed.namespace}-dra"
        await mixed.add_namespace(dra_ns, {"hami.io/device-mode": "dra"})
        spec = [limits(1, mem=2000, cores=30)]
        try:
            ext = await run(mixed, hami_pod(mixed, "same", spec))
            claimed = await run(mixed, hami_pod(mixed, "same", spec), dra_ns)
            # the extender's pod: hami's decision annotation, no claim
            assert ext["spec"]["nodeName"] == "ext-a100"
            assert ALLOCATED in ext["metadata"]["annotations"]
            assert not ext["spec"].get("resourceClaims")
            assert ext["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"]
            ext_env = (await mixed.admission(ext)).envs["c0"]
            assert ext_env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
            # the DRA namespace's pod: a claim kube-scheduler allocated on the DRA node
            assert claimed["spec"]["nodeName"] == "dra-a100"
            (result,) = (await the_claim(mixed, claimed, dra_ns))["status"]["allocation"][
                "devices"
            ]["results"]
            assert result["consumedCapacity"]["memory"] == "2000Mi"
            dra_env = (await mixed.admission(claimed)).envs["c0"]
            assert dra_env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
            assert dra_env["CUDA_DEVICE_SM_LIMIT"] == "30"
            # both still running side by side
            assert phase_of(await mixed.get_pod("same")) == "Running"
        finally:
            await mixed.kube.delete(f"/api/v1/namespaces/{dra_ns}/pods/same")
