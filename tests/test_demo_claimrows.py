"""The DRA demo's table rows from claims as read: a claim is untrusted input, so a result
without the values the table needs shows ``?`` and a pod whose claim is gone shows no
device, never a crash."""

from __future__ import annotations

from typing import Any

from hami.demo.claimrows import SliceDevice, placement_rows, slice_devices
from hami.demo.placement import HEADER

DRIVER = "nvidia.hami.io"
SLICE = {
    "spec": {
        "driver": DRIVER,
        "pool": {"name": "gpu-a"},
        "devices": [
            {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a-0"}}},
            {"name": "gpu-1", "attributes": {"uuid": "not a map"}},
            {
                "name": "gpu-2-mig-1g-5gb-6",
                "attributes": {"uuid": {"string": "GPU-a-2"}, "migProfile": {"string": "1g.5gb"}},
                "capacity": {"memory": {"value": "4864Mi"}, "cores": {"value": "14"}},
            },
        ],
    }
}
OTHER = {"spec": {"driver": "gpu.example.com", "pool": {"name": "gpu-a"}, "devices": [{}]}}


def pod(claims: list[dict[str, str]], status: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "spec": {
            "nodeName": "gpu-a",
            "initContainers": [{"name": "init0", "resources": {"claims": claims[:1]}}],
            "containers": [{"name": "c0", "resources": {"claims": claims[1:]}}],
        },
        "status": {"phase": "Running", "resourceClaimStatuses": status},
    }


def result(request: str, device: str, consumed: Any) -> dict[str, Any]:
    return {
        "request": request,
        "driver": DRIVER,
        "pool": "gpu-a",
        "device": device,
        "consumedCapacity": consumed,
    }


def test_rows_follow_each_containers_request() -> None:
    claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        result("init0", "gpu-0", {"memory": "2000Mi", "cores": "10"}),
                        result("c0/m1", "gpu-1", {"memory": "1Gi"}),  # a subrequest's name
                        "not a result",
                    ]
                }
            }
        }
    }
    body = pod(
        [{"name": "hami", "request": "init0"}, {"name": "hami", "request": "c0"}],
        [{"name": "hami", "resourceClaimName": "p-hami-x"}],
    )
    devices = slice_devices([SLICE, OTHER, "junk"])
    assert devices[(DRIVER, "gpu-a", "gpu-0")] == SliceDevice("GPU-a-0")
    assert (DRIVER, "gpu-a", "gpu-1") not in devices  # no uuid: nothing to show
    rows = placement_rows({"p": body}, [("p", "asks")], {"p-hami-x": claim}, devices, lambda u: u)
    assert rows[0] == HEADER
    init, main = rows[1:]
    assert init == [
        *("p/init0 (init)", "asks", "gpu-a", "GPU-a-0", "GPU-a-0", "2000", "10"),
        *("HAMi-core", "Running"),
    ]
    # no uuid attribute and no cores consumed: "?" where the value is unknown
    assert main[0] == "p/c0" and main[1] == "" and main[3:7] == ["?", "?", "1024", "?"]


def test_a_missing_claim_or_pod_shows_no_device() -> None:
    body = pod([{"name": "hami"}, {"name": "gone"}], [{"name": "hami", "resourceClaimName": "x"}])
    rows = placement_rows({"p": body}, [("p", "asks"), ("q", "more")], {}, {}, lambda u: u)
    assert rows[1] == ["p", "asks", "gpu-a", "-", "-", "-", "-", "-", "Running"]
    assert rows[2][-1] == "missing"


def test_a_mig_partition_row_has_its_profile_and_the_instance_seen() -> None:
    claim = {
        "status": {
            "allocation": {"devices": {"results": [result("gpu", "gpu-2-mig-1g-5gb-6", None)]}}
        }
    }
    body = pod([], [{"name": "m", "resourceClaimName": "p-m"}])
    body["spec"]["initContainers"] = []
    body["spec"]["containers"] = [{"name": "c0", "resources": {"claims": [{"name": "m"}]}}]
    devices = slice_devices([SLICE])
    args = ({"p": body}, [("p", "MIG")], {"p-m": claim}, devices, lambda u: f"NVIDIA-{u}")
    (_, row) = placement_rows(*args, {"p": {"c0": ["MIG-a-2-0001"]}})
    assert row == [
        *("p", "MIG", "gpu-a", "MIG-a-2-0001", "GPU-a-2", "4864", "14", "MIG 1g.5gb"),
        "Running",
    ]
    # the instance not known (yet): the GPU's uuid
    (_, row) = placement_rows(*args)
    assert row[3] == "GPU-a-2"
