"""MIG in the DRA mode on the real control plane (issue 23 item 5): a node agent with the
NVIDIA backend in ``operating_mode: mig`` over the fake NVML (an A100 40GB in MIG mode)
publishes its profiles as partitionable devices; kube-scheduler alone places claims of
mixed profiles until the GPU's memory slices are used up, the next claim stays Pending,
the instances the agent made are exactly the allocated partitions (answered by MIG UUID
through CDI), and deleting pods destroys their instances and frees the slices."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _nvml_helpers import FakeGpu, FakeNvml

from hami.backends.base import BackendSettings
from hami.backends.nvidia import NvidiaBackend
from hami.dra import migslices
from hami.kube.raw import KubeError
from hami.protocol.mig import placements_overlap
from hami.scheduler import draexplain
from hami.testkit.cluster import LocalCluster, NodeSpec, Timing, phase_of, poll
from hami.testkit.controlplane import ControlPlane
from hami.testkit.dra_pods import claims_path, dra_pod, templates_path
from hami.testkit.kubelet_dra import claim_path

pytestmark = [pytest.mark.controlplane, pytest.mark.asyncio(loop_scope="module")]

NODE = "gpu-mig"
GPU = "GPU-mig-a100-0"
PROFILES = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


def mig_backend(nvml: FakeNvml, work: Path, *, health_checks: bool = False) -> NvidiaBackend:
    """The NVIDIA backend in MIG mode over ``nvml`` (with ``health_checks``: its Xid
    watch on)."""
    options: dict[str, Any] = {
        "sysfs_root": str(work / "sys"),
        "topology_score": False,
        "health_checks": health_checks,
        "operating_mode": "mig",
        "mig_profile_allowlist": [{"models": ["A100-SXM4-40GB"], "profiles": PROFILES}],
        "mig_state_file": str(work / "mig-instances.json"),
        "hamicore": {"containers_dir": str(work / "vgpu" / "containers")},
    }
    settings = BackendSettings(split_count=7, options=options, register_format="json")
    return NvidiaBackend(settings, nvml=nvml)


@asynccontextmanager
async def mig_cluster(
    controlplane: ControlPlane, name: str, *, health_checks: bool = False
) -> AsyncIterator[tuple[LocalCluster, FakeNvml]]:
    """A DRA-mode cluster of one node ``name`` whose agent runs ``mig_backend`` over one
    fake A100 40GB in MIG mode."""
    spec = NodeSpec(name, ({"count": 1, "model": "unused", "memory": 1},))
    cluster = LocalCluster(
        (spec,), plane=controlplane, timing=Timing(handshake_timeout=3.0), mode="dra"
    )
    nvml = FakeNvml(
        [FakeGpu(0, GPU, "NVIDIA A100-SXM4-40GB", 40 << 30, "00000000:07:00.0", mig_mode=1)]
    )
    node = cluster.nodes[name]
    node.backend = mig_backend(nvml, node.dir, health_checks=health_checks)
    async with cluster:
        yield cluster, nvml


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mig(controlplane: ControlPlane) -> AsyncIterator[tuple[LocalCluster, FakeNvml]]:
    async with mig_cluster(controlplane, NODE) as found:
        yield found


async def profile_template(cluster: LocalCluster, profile: str) -> str:
    name = f"mig-{profile.replace('.', '-')}"
    expression = f'device.attributes["nvidia.hami.io"].migProfile == "{profile}"'
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "nvidia.hami.io",
                                "selectors": [{"cel": {"expression": expression}}],
                            },
                        }
                    ]
                }
            }
        },
    }
    try:
        await cluster.kube.create(templates_path(cluster.namespace), body)
    except KubeError as exc:
        if exc.status != 409:
            raise
    return name


async def allocated_device(cluster: LocalCluster, pod: Mapping[str, Any]) -> str:
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = await cluster.kube.request(
        "GET", claim_path(cluster.namespace, status["resourceClaimName"])
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == NODE
    return str(result["device"])


async def test_mixed_profiles_fill_the_gpu_and_instances_match(
    mig: tuple[LocalCluster, FakeNvml],
) -> None:
    cluster, nvml = mig
    node = cluster.nodes[NODE]
    assert node.agent is not None
    parts = migslices.partitions("nvidia", node.agent.states["fake"].devices)
    # what the API server holds: partitions in device slices, the GPU's counter set apart
    stored = await cluster.kube.request(
        "GET", f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-nvidia-hami-io-counters-1"
    )
    (counter_set,) = stored["spec"]["sharedCounters"]
    assert sorted(counter_set["counters"]) == [f"memory-slice-{i}" for i in range(8)]
    devices = await cluster.kube.request(
        "GET", f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-nvidia-hami-io"
    )
    published = [d["attributes"]["migProfile"]["string"] for d in devices["spec"]["devices"]]
    # only the allow-list's profiles (not 1g.5gb+me or 1g.10gb), each at every placement
    assert sorted(set(published)) == sorted(PROFILES)
    assert len(published) == 7 + 3 + 2 + 1 + 1

    # 3g + 2g + 1g + 1g take all 8 memory slices (Go's order of placements puts the 3g at
    # slice 4, so the 1g ones still find room); one more 1g has none
    asks = ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]
    placed: dict[str, str] = {}
    for i, profile in enumerate(asks):
        template = await profile_template(cluster, profile)
        await cluster.create_pod(dra_pod(f"m{i}", [template]))
        pod = await cluster.wait_pod(f"m{i}", timeout=60)
        assert phase_of(pod) == "Running", pod.get("status")
        device = await allocated_device(cluster, pod)
        assert parts[device].profile.name == profile
        env = (await cluster.admission(pod)).envs["c0"]
        placed[f"m{i}"] = device
        # the container sees exactly the MIG device made for its partition
        live = {pl: uuids for pl, uuids in nvml.live(0).values()}
        assert env["NVIDIA_VISIBLE_DEVICES"] == live[parts[device].placement][0]
        assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in env  # the instance is the limit
    layout = [parts[d].placement for d in placed.values()]
    assert sum(p.size for p in layout) == 8
    assert all(not placements_overlap(a, b) for i, a in enumerate(layout) for b in layout[i + 1 :])
    # the instances NVML holds are exactly the allocated partitions
    assert sorted((p.start, p.size) for p, _ in nvml.live(0).values()) == sorted(
        (p.start, p.size) for p in layout
    )

    template = await profile_template(cluster, "1g.5gb")
    await cluster.create_pod(dra_pod("waits", [template]))

    async def unschedulable() -> bool:
        for event in await cluster.events("waits"):
            if event.get("reason") == "FailedScheduling":
                return "cannot allocate all claims" in str(event.get("message"))
        return False

    await poll(unschedulable, 60, "kube-scheduler says the 1g claim cannot be allocated")
    waiting = await cluster.get_pod("waits")
    assert phase_of(waiting) == "Pending"
    assert len(nvml.live(0)) == 4
    # hami explain names the GPU and the claims holding its slices
    answer = await draexplain.explain(cluster.kube, waiting)
    assert answer is not None
    line = answer["nodes"][NODE]
    assert line.startswith(f"no 1g.5gb placement free on GPU {GPU}: "), answer
    assert line.count("held by claim") == 4, line

    # an agent restart (a new backend object: only the ledger file and the checkpoint carry
    # over) republishes the pool and keeps every instance
    before = nvml.live(0)
    await node.stop_agent()
    assert node.kubelet is not None
    kubelet_dra = node.kubelet.dra
    assert kubelet_dra is not None
    await node.kubelet.wait_for(lambda: "nvidia.hami.io" not in kubelet_dra.plugins, 30)
    restarted = mig_backend(nvml, node.dir)
    node.backend = restarted
    await node.start_agent()
    assert nvml.live(0) == before
    assert len(restarted.mig.ledger) == 4  # read back from the file

    # the 2g pod goes: the restarted agent destroys its instance on unprepare and the
    # waiting 1g lands in the freed slices
    freed = parts[placed["m1"]].placement
    await cluster.delete_pod("m1")
    pod = await cluster.wait_pod("waits", timeout=60)
    assert phase_of(pod) == "Running"
    got = parts[await allocated_device(cluster, pod)].placement
    assert not placements_overlap(got, parts[placed["m0"]].placement)
    assert placements_overlap(got, freed)
    assert freed not in [p for p, _ in nvml.live(0).values()]

    await cluster.delete_pods()

    async def freed_all() -> bool:
        items, _ = await cluster.kube.list_all(claims_path(cluster.namespace))
        allocated = any((c.get("status") or {}).get("allocation") for c in items)
        return not allocated and not nvml.live(0)

    await poll(freed_all, 60, "claims deallocated and every MIG instance destroyed")
    assert len(restarted.mig.ledger) == 0
