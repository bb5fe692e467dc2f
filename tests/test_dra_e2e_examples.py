"""The DRA request examples (config/examples/dra/*.yaml) run as written on a DRA-mode local
cluster: every claim template gets a pod placed by kube-scheduler alone, with the HAMi-core
limits the comment above it promises."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from hami.testkit.cluster import DEMO_NODES, SCHEDULER_NAME, LocalCluster, Timing, phase_of
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import dra_pod, templates_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

EXAMPLES = Path(__file__).resolve().parents[1] / "config" / "examples" / "dra"
MODEL_MIB = {"A100": 40960, "V100": 32768, "T4": 15360}


def _docs() -> dict[str, list[dict[str, Any]]]:
    return {
        p.name: [d for d in yaml.safe_load_all(p.read_text()) if d]
        for p in sorted(EXAMPLES.glob("*.yaml"))
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(DEMO_NODES, plane=controlplane, timing=Timing(), mode="dra") as c:
        yield c


async def _run(cluster: LocalCluster, docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Create the file's objects (a pod for a template that has none); container env by pod."""
    pods = [copy.deepcopy(d) for d in docs if d["kind"] == "Pod"]
    for d in docs:
        if d["kind"] == "ResourceClaimTemplate":
            await cluster.kube.create(templates_path(cluster.namespace), d)
            if not pods:
                pods.append(dra_pod(f"use-{d['metadata']['name']}", [d["metadata"]["name"]]))
    envs = {}
    for pod in pods:
        pod["spec"]["schedulerName"] = SCHEDULER_NAME
        await cluster.create_pod(pod)
        name = pod["metadata"]["name"]
        running = await cluster.wait_pod(name, timeout=60)
        assert phase_of(running) == "Running", running.get("status")
        adm = await cluster.admission(running)
        (env,) = adm.envs.values()
        envs[name] = env
    return envs


def _model(cluster: LocalCluster, env: dict[str, str], i: int = 0) -> str:
    return cluster.model_of(env["NVIDIA_VISIBLE_DEVICES"].split(",")[i])


async def test_every_example_is_covered() -> None:
    assert sorted(_docs()) == [
        "claim-3000mib.yaml",
        "claim-half-memory-30-cores.yaml",
        "claim-model-selector.yaml",
        "claim-two-devices.yaml",
        "extended-resource.yaml",
    ]


async def test_3000mib(cluster: LocalCluster) -> None:
    (env,) = (await _run(cluster, _docs()["claim-3000mib.yaml"])).values()
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


async def test_half_memory_30_cores(cluster: LocalCluster) -> None:
    (env,) = (await _run(cluster, _docs()["claim-half-memory-30-cores.yaml"])).values()
    model = _model(cluster, env)
    total = next(mib for key, mib in MODEL_MIB.items() if key in model)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{total // 2}m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"


async def test_two_devices(cluster: LocalCluster) -> None:
    (env,) = (await _run(cluster, _docs()["claim-two-devices.yaml"])).values()
    assert len(set(env["NVIDIA_VISIBLE_DEVICES"].split(","))) == 2
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "8000m"


async def test_model_selector(cluster: LocalCluster) -> None:
    (env,) = (await _run(cluster, _docs()["claim-model-selector.yaml"])).values()
    assert "V100" in _model(cluster, env)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10000m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "25"


async def test_extended_resource(cluster: LocalCluster) -> None:
    await cluster.map_extended_resource("nvidia.com/gpu")  # as the example's comment says
    try:
        (env,) = (await _run(cluster, _docs()["extended-resource.yaml"])).values()
    finally:
        await cluster.map_extended_resource(None)
    total = next(mib for key, mib in MODEL_MIB.items() if key in _model(cluster, env))
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{total}m"
