"""Issue 22 items 2 and 7 on the real control plane: one claim of three requests shared by
two containers (one uses requests a and b, the other c). kube-scheduler allocates the claim,
the node agent prepares one CDI device per group of requests the containers use together,
and the kubelet emulator (kubelet's rule: a container gets the CDI ids of the requests it
names) gives each container only its own requests' devices and HAMi-core limits. The usage
monitor reads each group's HAMi-core directory (a region written as libvgpu.so lays it
out), names the pod, the claim and the requests in its series, and removes the directories
once the pod is gone."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _monitor_helpers import Proc, RegionSpec, write_region
from prometheus_client.parser import text_string_to_metric_families

from hami import config
from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, phase_of, poll
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import templates_path
from hami.testkit.kubelet_dra import claim_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

NODE = "gpu-three"
DRIVER = "nvidia.hami.io"
MIB = 2**20
ASKED = {"a": (1000, 10), "b": (2000, 20), "c": (3000, 30)}  # MiB, cores


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(controlplane: ControlPlane) -> AsyncIterator[LocalCluster]:
    c = LocalCluster(
        (NodeSpec(NODE, ({"count": 3, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960},)),),
        plane=controlplane,
        timing=Timing(handshake_timeout=3.0),
        mode="dra",
    )
    # the monitor quick: a pass every 200 ms, a gone pod's directory removed after 1 s
    monitor = config.MonitorConfig(
        scan_period=config.Duration(0.2), cleanup_grace=config.Duration(1.0)
    )
    for sim in c.nodes.values():
        sim.cfg = dataclasses.replace(
            sim.cfg, node=dataclasses.replace(sim.cfg.node, monitor=monitor)
        )
    async with c:
        yield c


def template() -> dict[str, Any]:
    requests = [
        {
            "name": name,
            "exactly": {
                "deviceClassName": DRIVER,
                "capacity": {"requests": {"memory": f"{mem}Mi", "cores": str(cores)}},
            },
        }
        for name, (mem, cores) in ASKED.items()
    ]
    # distinct devices: one container gets each device once
    constraints = [{"requests": list(ASKED), "distinctAttribute": f"{DRIVER}/uuid"}]
    return {
        "metadata": {"name": "three"},
        "spec": {"spec": {"devices": {"requests": requests, "constraints": constraints}}},
    }


def pod() -> dict[str, Any]:
    def container(name: str, requests: list[str]) -> dict[str, Any]:
        claims = [{"name": "gpus", "request": r} for r in requests]
        return {"name": name, "image": "busybox", "resources": {"claims": claims}}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "shared"},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [container("ab", ["a", "b"]), container("c", ["c"])],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "three"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def series(text: str, name: str) -> dict[tuple[str, str, str, str], float]:
    """(pod, container, device uuid, namespace) -> value of family ``name``."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                key = (s.labels["pod"], s.labels["container"], s.labels["device_uuid"])
                out[(*key, s.labels["namespace"])] = s.value
    return out


async def test_three_requests_two_containers_and_the_monitor(cluster: LocalCluster) -> None:
    ns = cluster.namespace
    await cluster.kube.create(templates_path(ns), template())
    await cluster.create_pod(pod())
    running = await cluster.wait_pod("shared", timeout=60)
    assert phase_of(running) == "Running", running.get("status")
    (status,) = running["status"]["resourceClaimStatuses"]
    claim_name = status["resourceClaimName"]
    claim = await cluster.kube.request("GET", claim_path(ns, claim_name))
    uid, pod_uid = claim["metadata"]["uid"], running["metadata"]["uid"]
    sim = cluster.nodes[NODE]
    uuids = {
        r["request"]: sim.uuids[int(r["device"].rsplit("-", 1)[1])]
        for r in claim["status"]["allocation"]["devices"]["results"]
    }
    assert sorted(uuids) == ["a", "b", "c"] and len(set(uuids.values())) == 3

    # each container: only its requests' devices and limits (kubelet's CDI ids per request)
    envs = (await cluster.admission(running)).envs
    ab, c = envs["ab"], envs["c"]
    assert ab["NVIDIA_VISIBLE_DEVICES"] == f"{uuids['a']},{uuids['b']}"
    assert (ab["CUDA_DEVICE_MEMORY_LIMIT_0"], ab["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
        "1000m",
        "2000m",
    )
    assert ab["CUDA_DEVICE_SM_LIMIT"] == "10"
    assert "CUDA_DEVICE_MEMORY_LIMIT_2" not in ab
    assert c["NVIDIA_VISIBLE_DEVICES"] == uuids["c"]
    assert c["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert c["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert "CUDA_DEVICE_MEMORY_LIMIT_1" not in c
    assert ab["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != c["CUDA_DEVICE_MEMORY_SHARED_CACHE"]

    # the claim's CDI spec: one device per group, each mounting its own HAMi-core directory
    spec_file = Path(sim.cfg.node.dra.cdi_dir) / f"{DRIVER}-{uid}.json"
    spec = json.loads(spec_file.read_text())
    containers = Path(sim.dir) / "vgpu"
    dirs = {"a+b": f"{pod_uid}_claim-{claim_name}_a+b", "c": f"{pod_uid}_claim-{claim_name}_c"}
    mounts = {
        d["name"]: {m["containerPath"]: m["hostPath"] for m in d["containerEdits"]["mounts"]}
        for d in spec["devices"]
    }
    assert mounts == {
        f"{uid}-a": {**mounts[f"{uid}-a"], "/usr/local/vgpu": str(containers / dirs["a+b"])},
        f"{uid}-c": {**mounts[f"{uid}-c"], "/usr/local/vgpu": str(containers / dirs["c"])},
    }
    assert all((containers / d).is_dir() for d in dirs.values())

    # the usage monitor: each group's region, as libvgpu.so in those containers writes it
    write_region(
        containers,
        pod_uid,
        f"claim-{claim_name}_a+b",
        RegionSpec(
            uuids=(uuids["a"], uuids["b"]),
            limits=(1000 * MIB, 2000 * MIB),
            procs=[Proc(memory={0: (1, 2, 3, 0, 300 * MIB), 1: (1, 2, 3, 0, 500 * MIB)})],
        ),
    )
    write_region(
        containers,
        pod_uid,
        f"claim-{claim_name}_c",
        RegionSpec(
            uuids=(uuids["c"],),
            limits=(3000 * MIB,),
            procs=[Proc(memory={0: (1, 2, 3, 0, 700 * MIB)})],
        ),
    )
    agent = sim.agent
    assert agent is not None and agent.monitor is not None
    monitor = agent.monitor
    await poll(lambda: len(monitor.snapshot.containers) == 2, 30, "both regions read")
    text = agent.metrics.render().decode()
    ab_label, c_label = f"claim-{claim_name}_a+b", f"claim-{claim_name}_c"
    assert series(text, "hami_vgpu_memory_used_bytes") == {
        ("shared", ab_label, uuids["a"], ns): 300 * MIB,
        ("shared", ab_label, uuids["b"], ns): 500 * MIB,
        ("shared", c_label, uuids["c"], ns): 700 * MIB,
    }
    assert series(text, "hami_vgpu_memory_limit_bytes") == {
        ("shared", ab_label, uuids["a"], ns): 1000 * MIB,
        ("shared", ab_label, uuids["b"], ns): 2000 * MIB,
        ("shared", c_label, uuids["c"], ns): 3000 * MIB,
    }

    # the pod goes: kubelet unprepares (the spec goes), the monitor removes both directories
    # (their files untouched for longer than the grace) and their series
    await cluster.delete_pods()
    await poll(lambda: not spec_file.exists(), 30, "the claim's CDI spec removed")
    then = time.time() - 3600
    for d in dirs.values():
        for path in (containers / d / "a1.cache", containers / d):
            os.utime(path, (then, then), follow_symlinks=False)
    await poll(
        lambda: not any((containers / d).exists() for d in dirs.values()),
        30,
        "the gone pod's directories removed",
    )
    await poll(lambda: not monitor.snapshot.containers, 10, "no series left")
    assert "hami_vgpu_memory_used_bytes{" not in agent.metrics.render().decode()


async def test_two_containers_share_one_device_with_a_limit_each(cluster: LocalCluster) -> None:
    """Two requests of one claim on the same device (``matchAttribute`` on the uuid), one per
    container: what two containers of an extender-mode pod get, a limit and a region each."""
    ns = cluster.namespace
    body = template()
    spec = body["spec"]["spec"]["devices"]
    spec["requests"] = [r for r in spec["requests"] if r["name"] in ("a", "b")]
    spec["constraints"] = [{"requests": ["a", "b"], "matchAttribute": f"{DRIVER}/uuid"}]
    body["metadata"]["name"] = "one-device"
    await cluster.kube.create(templates_path(ns), body)
    manifest = pod()
    manifest["metadata"]["name"] = "halves"
    manifest["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "one-device"
    manifest["spec"]["containers"] = [
        {"name": n, "image": "busybox", "resources": {"claims": [{"name": "gpus", "request": n}]}}
        for n in ("a", "b")
    ]
    await cluster.create_pod(manifest)
    running = await cluster.wait_pod("halves", timeout=60)
    assert phase_of(running) == "Running", running.get("status")
    (status,) = running["status"]["resourceClaimStatuses"]
    claim = await cluster.kube.request("GET", claim_path(ns, status["resourceClaimName"]))
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len({r["device"] for r in results}) == 1  # both requests on one device
    uuid = cluster.nodes[NODE].uuids[int(results[0]["device"].rsplit("-", 1)[1])]
    envs = (await cluster.admission(running)).envs
    for name, (mem, cores) in (("a", ASKED["a"]), ("b", ASKED["b"])):
        env = envs[name]
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{mem}m"
        assert env["CUDA_DEVICE_SM_LIMIT"] == str(cores)
        assert "CUDA_DEVICE_MEMORY_LIMIT_1" not in env
    assert (
        envs["a"]["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != envs["b"]["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    )
    await cluster.delete_pods()
