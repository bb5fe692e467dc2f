"""One CDI device per group of a claim's requests (issue 22 item 2): which requests the
containers use together (hami.dra.groups) and what prepare writes for each group (pure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hami.backends.base import BackendSettings, Device
from hami.backends.fake import FakeBackend
from hami.dra import cdi
from hami.dra.checkpoint import Checkpoint
from hami.dra.claims import claim_allocation
from hami.dra.groups import container_requests, request_groups
from hami.dra.plugin import DRAService, _device_message
from hami.dra.prepare import NAME_MAX, prepare_claim
from hami.kube.raw import KubeError
from hami.node.allocate import AllocateError, check_entry

NODE = "node-a"
DEVICES = [
    Device("GPU-a-0", 0, "NVIDIA A100", 40960),
    Device("GPU-a-1", 1, "NVIDIA A100", 40960),
    Device("GPU-a-2", 2, "NVIDIA A100", 40960),
]
CONTAINERS = "/usr/local/vgpu/containers"


def result(request: str, device: str, memory: str, cores: str, n: int) -> dict[str, Any]:
    return {
        "request": request,
        "driver": "nvidia.hami.io",
        "pool": NODE,
        "device": device,
        "consumedCapacity": {"memory": memory, "cores": cores, "slots": "1"},
        "shareID": f"7e57a1c0-0000-4000-8000-00000000000{n}",
    }


THREE = [
    result("a", "nvidia-0", "1000Mi", "10", 1),
    result("b", "nvidia-1", "2000Mi", "20", 2),
    result("c", "nvidia-2", "3000Mi", "30", 3),
]


def claim(results: list[dict[str, Any]], name: str = "c1") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": "uid-1"},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid-1"}],
        },
    }


def pod(*containers: list[dict[str, Any]], claim_name: str = "c1") -> dict[str, Any]:
    """A pod whose entry ``gpus`` is the claim; container i names ``containers[i]``."""
    return {
        "metadata": {"name": "p", "uid": "pod-uid-1"},
        "spec": {
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim_name}],
            "containers": [
                {"name": f"x{i}", "resources": {"claims": refs}}
                for i, refs in enumerate(containers)
            ],
        },
    }


def prepared(body: dict[str, Any], pods: list[dict[str, Any]]) -> Any:
    backend = FakeBackend(BackendSettings(split_count=4))
    alloc = claim_allocation(
        body,
        uid="uid-1",
        node=NODE,
        backend=backend,
        node_devices=DEVICES,
        check=check_entry,
        pods=pods,
    )
    return prepare_claim(alloc, backend, DEVICES)


def kubelet_ids(devices: list[dict[str, Any]], request: str) -> list[str]:
    """kubelet's ClaimInfo.cdiDevicesAsList: the ids on the devices of ``request`` (every
    device for ''), in the answer's order, not deduplicated."""
    return [
        i
        for d in devices
        if not request or not d["requestNames"] or request in d["requestNames"]
        for i in d["cdiDeviceIds"]
    ]


def test_groups_follow_the_containers() -> None:
    reqs = ["a", "b", "c"]
    assert request_groups(reqs, [frozenset("ab"), frozenset("c")]) == [("a", "b"), ("c",)]
    # a container naming the whole claim, or sets sharing a request: one device for all
    assert request_groups(reqs, [frozenset("abc"), frozenset("c")]) == [("a", "b", "c")]
    assert request_groups(reqs, [frozenset("ab"), frozenset("bc")]) == [("a", "b", "c")]
    # requests nobody names yet (a pod joining a shared claim later) are one group
    assert request_groups([*reqs, "d"], [frozenset("a"), frozenset("b")]) == [
        ("a",),
        ("b",),
        ("c", "d"),
    ]
    assert request_groups(["a", "a", "b"], []) == [("a", "b")]


def test_container_requests_read_the_pod_as_kubelet_does() -> None:
    reqs = ["a", "b", "c"]
    body = pod(
        [{"name": "gpus", "request": "a"}, {"name": "gpus", "request": "b"}],
        [{"name": "gpus", "request": "c"}],
        [{"name": "gpus"}],  # the whole claim
        [{"name": "other"}, {"name": "gpus", "request": "zz"}],  # another claim, no request
        [],
    )
    assert container_requests(body, "c1", reqs) == [
        frozenset("ab"),
        frozenset("c"),
        frozenset("abc"),
    ]
    assert container_requests(body, "another-claim", reqs) == []
    # a template's claim, through the pod's status; an init container counts too
    templated = {
        "spec": {
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}],
            "initContainers": [{"name": "i", "resources": {"claims": [{"name": "gpus"}]}}],
            "containers": [
                {"name": "m", "resources": {"claims": [{"name": "gpus", "request": "c"}]}}
            ],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x"}]},
    }
    assert container_requests(templated, "p-gpus-x", reqs) == [frozenset("abc"), frozenset("c")]
    # kube-scheduler's claim for a mapped extended resource: per container request mappings
    mapped = {
        "spec": {"containers": [{"name": "m"}, {"name": "n"}]},
        "status": {
            "extendedResourceClaimStatus": {
                "resourceClaimName": "p-ext",
                "requestMappings": [
                    {"containerName": "m", "resourceName": "nvidia.com/gpu", "requestName": "a"},
                    {"containerName": "n", "resourceName": "nvidia.com/gpu", "requestName": "b"},
                ],
            }
        },
    }
    assert container_requests(mapped, "p-ext", reqs) == [frozenset("a"), frozenset("b")]
    # untrusted shapes are skipped, never raised on
    junks: list[dict[str, Any]] = [
        {},
        {"spec": []},
        {"spec": {"containers": "x", "resourceClaims": [1]}},
    ]
    for junk in junks:
        assert container_requests(junk, "c1", reqs) == []


def test_three_requests_two_containers_each_gets_only_its_own() -> None:
    body = pod(
        [{"name": "gpus", "request": "a"}, {"name": "gpus", "request": "b"}],
        [{"name": "gpus", "request": "c"}],
    )
    p = prepared(claim(THREE), [body])
    assert [(g.requests, g.cdi_name) for g in p.groups] == [
        (("a", "b"), "uid-1-a"),
        (("c",), "uid-1-c"),
    ]
    ab, c = cdi.spec_env(p.spec, "uid-1-a"), cdi.spec_env(p.spec, "uid-1-c")
    assert ab["NVIDIA_VISIBLE_DEVICES"] == "GPU-a-0,GPU-a-1"
    assert (ab["CUDA_DEVICE_MEMORY_LIMIT_0"], ab["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
        "1000m",
        "2000m",
    )
    assert ab["CUDA_DEVICE_SM_LIMIT"] == "10"
    assert "CUDA_DEVICE_MEMORY_LIMIT_2" not in ab
    assert c["NVIDIA_VISIBLE_DEVICES"] == "GPU-a-2"
    assert c["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert c["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert "CUDA_DEVICE_MEMORY_LIMIT_1" not in c
    assert ab["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != c["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    # a HAMi-core directory per group: the limiter's region is per container group
    mounts = {
        dev["name"]: {m["containerPath"]: m["hostPath"] for m in dev["containerEdits"]["mounts"]}
        for dev in p.spec["devices"]
    }
    assert mounts["uid-1-a"]["/usr/local/vgpu"] == f"{CONTAINERS}/pod-uid-1_claim-c1_a+b"
    assert mounts["uid-1-c"]["/usr/local/vgpu"] == f"{CONTAINERS}/pod-uid-1_claim-c1_c"
    assert p.host_dirs == [
        f"{CONTAINERS}/pod-uid-1_claim-c1_a+b",
        f"{CONTAINERS}/pod-uid-1_claim-c1_c",
    ]
    # what kubelet hands each container: one CDI device of ours (twice for a and b: the
    # same edits applied twice), never the other group's
    a_id, c_id = "nvidia.hami.io/claim=uid-1-a", "nvidia.hami.io/claim=uid-1-c"
    assert kubelet_ids(p.devices, "a") + kubelet_ids(p.devices, "b") == [a_id, a_id]
    assert kubelet_ids(p.devices, "c") == [c_id]
    assert [d["requestNames"] for d in p.devices] == [["a"], ["b"], ["c"]]


def test_one_group_keeps_the_names_of_one_device_per_claim() -> None:
    """A container naming the whole claim (or no pod known): one device with every slice,
    named as before (old checkpoints, the monitor's ``claim-{name}`` directories)."""
    for pods in ([pod([{"name": "gpus"}], [{"name": "gpus", "request": "c"}])], []):
        p = prepared(claim(THREE), pods)
        (group,) = p.groups
        assert group.cdi_name == "uid-1"
        assert p.host_dirs == [f"{CONTAINERS}/pod-uid-1_claim-c1"]
        env = cdi.spec_env(p.spec, "uid-1")
        assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a-0,GPU-a-1,GPU-a-2"
        assert kubelet_ids(p.devices, "") == ["nvidia.hami.io/claim=uid-1"] * 3


def test_a_directory_name_too_long_uses_the_claim_uid() -> None:
    name = "n" * 240  # claim names may be 253 characters; a directory name 255 bytes
    body = pod(
        [{"name": "gpus", "request": "a"}, {"name": "gpus", "request": "b"}],
        [{"name": "gpus", "request": "c"}],
        claim_name=name,
    )
    p = prepared(claim(THREE, name=name), [body])
    assert p.host_dirs == [
        f"{CONTAINERS}/pod-uid-1_claim-uid-1_a",
        f"{CONTAINERS}/pod-uid-1_claim-uid-1_c",
    ]
    assert all(len(d.rsplit("/", 1)[1]) <= NAME_MAX for d in p.host_dirs)


def test_admin_claim_groups_get_no_hamicore() -> None:
    results = [{**r, "adminAccess": True, "consumedCapacity": {"memory": "1Mi"}} for r in THREE[:2]]
    body = claim(results)
    body["spec"] = {
        "devices": {
            "requests": [
                {"name": r, "exactly": {"deviceClassName": "nvidia.hami.io", "adminAccess": True}}
                for r in ("a", "b")
            ]
        }
    }
    watcher = pod([{"name": "gpus", "request": "a"}], [{"name": "gpus", "request": "b"}])
    p = prepared(body, [watcher])
    assert [g.requests for g in p.groups] == [("a",), ("b",)]
    assert cdi.spec_env(p.spec, "uid-1-a") == {"NVIDIA_VISIBLE_DEVICES": "GPU-a-0"}
    assert cdi.spec_env(p.spec, "uid-1-b") == {"NVIDIA_VISIBLE_DEVICES": "GPU-a-1"}
    assert p.host_dirs == []


class FakeKube:
    """The plugin's one API call, GET, from a dict of paths; an exception is raised."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects
        self.paths: list[str] = []

    async def request(self, method: str, path: str) -> dict[str, Any]:
        self.paths.append(path)
        found = self.objects[path]
        if isinstance(found, Exception):
            raise found
        return dict(found)


def service(tmp_path: Path, kube: FakeKube) -> DRAService:
    checkpoint = Checkpoint(tmp_path / "plugins" / "checkpoint.json")
    checkpoint.load()
    options = {"hamicore": {"containers_dir": str(tmp_path / "containers")}}
    return DRAService(
        node=NODE,
        backend=FakeBackend(BackendSettings(split_count=4, options=options)),
        devices=lambda: list(DEVICES),
        kube=kube,
        check=check_entry,
        cdi_dir=str(tmp_path / "cdi"),
        checkpoint=checkpoint,
    )


CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1"
POD_PATH = "/api/v1/namespaces/ns/pods/p"


async def test_the_plugin_reads_the_reserving_pod(tmp_path: Path) -> None:
    two = pod(
        [{"name": "gpus", "request": "a"}, {"name": "gpus", "request": "b"}],
        [{"name": "gpus", "request": "c"}],
    )
    kube = FakeKube({CLAIM_PATH: claim(THREE), POD_PATH: two})
    devices = await service(tmp_path, kube).prepare("ns", "c1", "uid-1")
    assert kube.paths == [CLAIM_PATH, POD_PATH]
    assert [d["cdiDeviceIds"] for d in devices] == [
        ["nvidia.hami.io/claim=uid-1-a"],
        ["nvidia.hami.io/claim=uid-1-a"],
        ["nvidia.hami.io/claim=uid-1-c"],
    ]
    assert sorted(p.name for p in (tmp_path / "containers").iterdir()) == [
        "pod-uid-1_claim-c1_a+b",
        "pod-uid-1_claim-c1_c",
    ]


async def test_a_pod_gone_or_replaced_leaves_one_group_other_errors_fail(
    tmp_path: Path,
) -> None:
    replaced = {**pod([{"name": "gpus", "request": "a"}]), "metadata": {"uid": "other"}}
    for found in (KubeError(404, "NotFound", "gone", POD_PATH), replaced):
        kube = FakeKube({CLAIM_PATH: claim(THREE), POD_PATH: found})
        devices = await service(tmp_path / str(id(found)), kube).prepare("ns", "c1", "uid-1")
        assert {i for d in devices for i in d["cdiDeviceIds"]} == {"nvidia.hami.io/claim=uid-1"}
    # no right to read pods, or the API server failing: kubelet retries, nothing is guessed
    kube = FakeKube({CLAIM_PATH: claim(THREE), POD_PATH: KubeError(403, "Forbidden", "", "")})
    svc = service(tmp_path / "forbidden", kube)
    with pytest.raises(KubeError):
        await svc.prepare("ns", "c1", "uid-1")
    assert svc.checkpoint.claims == {}


async def test_a_checkpoint_of_the_previous_version_still_serves_and_unprepares(
    tmp_path: Path,
) -> None:
    """The previous version wrote one CDI device per claim, named by the claim uid; its
    entries (same file format) answer a repeated prepare and unprepare cleanly."""
    old_spec = {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.hami.io/claim",
        "devices": [
            {
                "name": "uid-old",
                "containerEdits": {
                    "env": ["CUDA_DEVICE_MEMORY_LIMIT_0=1000m", "NVIDIA_VISIBLE_DEVICES=GPU-a-0"]
                },
            }
        ],
    }
    old_devices = [
        {
            "requestNames": [r],
            "poolName": NODE,
            "deviceName": f"nvidia-{i}",
            "cdiDeviceIds": ["nvidia.hami.io/claim=uid-old"],
            "shareId": f"7e57a1c0-0000-4000-8000-00000000000{i}",
        }
        for i, r in enumerate(["a", "b"])
    ]
    path = tmp_path / "plugins" / "checkpoint.json"
    path.parent.mkdir(parents=True)
    entry = {"namespace": "ns", "name": "old", "devices": old_devices, "spec": old_spec}
    path.write_text(json.dumps({"version": 1, "claims": {"uid-old": entry}}))
    kube = FakeKube({})  # nothing is read: the checkpoint answers
    svc = service(tmp_path, kube)
    assert await svc.prepare("ns", "old", "uid-old") == old_devices
    spec_file = tmp_path / "cdi" / "nvidia.hami.io-uid-old.json"
    assert json.loads(spec_file.read_text()) == old_spec  # written again: it was missing
    assert kube.paths == []
    await svc.unprepare("uid-old")
    assert not spec_file.exists()
    assert json.loads(path.read_text())["claims"] == {}


def test_two_requests_on_one_device_in_two_containers() -> None:
    """kube-scheduler may put two requests of one claim on one shared device: fine when
    different containers use them (a region and a limit each, as two containers of an
    extender-mode pod), refused when one container would get the device twice."""
    same = [result("a", "nvidia-0", "1000Mi", "10", 1), result("b", "nvidia-0", "2000Mi", "20", 2)]
    split = pod([{"name": "gpus", "request": "a"}], [{"name": "gpus", "request": "b"}])
    p = prepared(claim(same), [split])
    a, b = cdi.spec_env(p.spec, "uid-1-a"), cdi.spec_env(p.spec, "uid-1-b")
    assert (a["NVIDIA_VISIBLE_DEVICES"], a["CUDA_DEVICE_MEMORY_LIMIT_0"]) == ("GPU-a-0", "1000m")
    assert (b["NVIDIA_VISIBLE_DEVICES"], b["CUDA_DEVICE_MEMORY_LIMIT_0"]) == ("GPU-a-0", "2000m")
    together = pod(
        [{"name": "gpus", "request": "a"}, {"name": "gpus", "request": "b"}],
        [{"name": "gpus", "request": "c"}],
    )
    with pytest.raises(AllocateError, match="requests a\\+b: device GPU-a-0 is listed twice"):
        prepared(claim([*same, THREE[2]]), [together])
    with pytest.raises(AllocateError, match="c1: device GPU-a-0 is listed twice"):
        prepared(claim(same), [])  # no container known: one group, as before


def test_a_first_available_result_is_answered_by_its_main_request() -> None:
    """kubelet matches a container's ``request`` exactly against the answer's names, and a
    container names the main request ``gpu``, never the subrequest ``gpu/a100``."""
    body = claim([result("gpu/a100", "nvidia-0", "1000Mi", "10", 1)])
    p = prepared(body, [pod([{"name": "gpus", "request": "gpu"}])])
    assert p.devices[0]["requestNames"] == ["gpu"]
    assert kubelet_ids(p.devices, "gpu") == ["nvidia.hami.io/claim=uid-1"]
    # a checkpoint entry of a version that answered the subrequest is sent as the main one
    old = {"requestNames": ["gpu/a100"], "poolName": NODE, "deviceName": "nvidia-0"}
    assert list(_device_message(old).request_names) == ["gpu"]
