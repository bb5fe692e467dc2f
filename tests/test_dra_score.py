"""The DRA mode's node score, pure parts and the room (no API server): the claim -> request
mapping (hami.dra.podrequest), slices and claims as devices and holds (hami.dra.inventory),
the cost -> score mapping and prioritize on bad input (hami.scheduler.drascore)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from hami import config
from hami.backends.base import BackendSettings, Device
from hami.backends.fake import FakeBackend
from hami.core.requests import DeviceKind, RequestError
from hami.dra import inventory, podrequest, slices
from hami.scheduler.drascore import DraScore, priorities
from hami.testkit.dra_pods import claim_spec, claim_template, dra_pod, percent_template

BACKEND = FakeBackend(BackendSettings(split_count=10))
KIND = DeviceKind.from_backend(BACKEND)
CLASSES = {"nvidia.hami.io": KIND}
DRIVERS = {"nvidia.hami.io": "nvidia"}


def lookups(
    claims: dict[str, Any] | None = None, templates: dict[str, Any] | None = None
) -> tuple[podrequest.Lookup, podrequest.Lookup]:
    def claim(ns: str, name: str) -> Any:
        return (claims or {}).get(f"{ns}/{name}")

    def template(ns: str, name: str) -> Any:
        return (templates or {}).get(f"{ns}/{name}")

    return claim, template


def pod(templates: list[str], ns: str = "ns") -> dict[str, Any]:
    body = dra_pod("p", templates)
    body["metadata"]["namespace"] = ns
    return body


# ------------------------------------------------------------------ claim -> request


def test_template_shapes_map_to_device_requests() -> None:
    templates = {
        "ns/t3000": claim_template("t3000", mem=3000, cores=30),
        "ns/whole": claim_template("whole"),
        "ns/two": claim_template("two", count=2, mem=8000, model="A100"),
    }
    request = podrequest.pod_request(
        pod(["t3000", "whole", "two"]), CLASSES, *lookups(templates=templates)
    )
    assert request is not None
    assert request.init_count == 0
    (a,), (b,), (c,) = request.containers
    assert (a.count, a.memory, a.memory_percentage, a.cores) == (1, 3000, None, 30)
    # no memory named: the published default, the whole device; no cores: the default
    assert (b.count, b.memory, b.memory_percentage, b.cores) == (1, 0, 100, KIND.default_cores)
    assert (c.count, c.memory, c.cores) == (2, 8000, 0)
    # one request names a model, the others any: no type selector narrows the node
    assert request.selectors == {}


def test_model_selector_and_memory_rounding() -> None:
    spec = claim_spec(mem=1, model="T4")
    spec["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "1500k"
    claims = {"ns/c": {"metadata": {"name": "c"}, "spec": spec}}
    body = pod([])
    body["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "c"}]
    request = podrequest.pod_request(body, CLASSES, *lookups(claims=claims))
    assert request is not None
    ((item,),) = request.containers
    assert item.memory == 2  # 1.5 MB is 1.43 MiB: rounded up
    assert request.selectors["nvidia"].use_types == ("t4",)


def test_claim_made_from_template_is_read_over_the_template() -> None:
    body = pod(["t"])
    body["status"] = {"resourceClaimStatuses": [{"name": "gpu0", "resourceClaimName": "p-gpu0"}]}
    claims = {"ns/p-gpu0": {"spec": claim_spec(mem=5000)}}
    templates = {"ns/t": claim_template("t", mem=1)}
    request = podrequest.pod_request(body, CLASSES, *lookups(claims, templates))
    assert request is not None and request.containers[0][0].memory == 5000


def test_first_available_takes_the_first_hami_subrequest() -> None:
    tpl = percent_template("half", {"A100": 40960, "T4": 15360}, 50, cores=20)
    tpl["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"].insert(
        0, {"name": "other", "deviceClassName": "gpu.example.com"}
    )
    request = podrequest.pod_request(pod(["half"]), CLASSES, *lookups(templates={"ns/half": tpl}))
    assert request is not None
    ((item,),) = request.containers
    assert (item.memory, item.cores) == (20480, 20)
    assert request.selectors["nvidia"].use_types == ("a100",)


def test_no_hami_claim_is_no_opinion() -> None:
    other = claim_template("o", device_class="gpu.example.com")
    assert podrequest.pod_request(pod(["o"]), CLASSES, *lookups(templates={"ns/o": other})) is None
    plain = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c"}]}}
    assert podrequest.pod_request(plain, CLASSES, *lookups()) is None


@pytest.mark.parametrize(
    ("exactly", "words"),
    [
        ({"allocationMode": "All"}, "allocationMode All"),
        ({"count": 0}, "count 0"),
        ({"count": "2"}, "count '2'"),
        ({"capacity": {"requests": {"memory": "lots"}}}, "memory 'lots'"),
        ({"capacity": {"requests": {"memory": "0"}}}, "not above 0"),
        ({"capacity": {"requests": {"cores": "101"}}}, "0..100"),
        ({"capacity": "x"}, "capacity is not an object"),
        ({"selectors": "x"}, "selectors is not a list"),
    ],
)
def test_malformed_claim_names_pod_and_object(exactly: dict[str, Any], words: str) -> None:
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {**claim_spec()["devices"]["requests"][0]["exactly"], **exactly},
                }
            ]
        }
    }
    templates = {"ns/bad": {"spec": {"spec": spec}}}
    with pytest.raises(RequestError) as caught:
        podrequest.pod_request(pod(["bad"]), CLASSES, *lookups(templates=templates))
    message = str(caught.value)
    assert "pod ns/p" in message
    assert "ResourceClaimTemplate ns/bad request 'gpu'" in message
    assert words in message


def test_malformed_pod_and_unknown_claim() -> None:
    with pytest.raises(RequestError, match=r"pod ns/p: spec\.resourceClaims is not a list"):
        podrequest.pod_request(
            {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"resourceClaims": 3}},
            CLASSES,
            *lookups(),
        )
    with pytest.raises(podrequest.UnknownClaim, match="ResourceClaimTemplate ns/t is not known"):
        podrequest.pod_request(pod(["t"]), CLASSES, *lookups())


# ------------------------------------------------------------------ cost -> score


def test_priorities_map_costs_to_0_10() -> None:
    costs = {"a": -50.0, "b": 50.0, "c": 0.0}
    assert priorities(costs, ["a", "b", "c", "d", "a"]) == [
        {"Host": "a", "Score": 10},
        {"Host": "b", "Score": 1},
        {"Host": "c", "Score": 5},  # 1 + round(4.5): half to even, 4
        {"Host": "d", "Score": 0},  # no fit
    ]
    assert priorities({"a": 3.0, "b": 3.0}, ["a", "b"]) == [
        {"Host": "a", "Score": 10},
        {"Host": "b", "Score": 10},
    ]
    assert priorities({"a": float("nan")}, ["a", "b"]) == [
        {"Host": "a", "Score": 0},
        {"Host": "b", "Score": 0},
    ]
    assert priorities({}, []) == []


def test_priorities_are_deterministic_and_ordered_by_cost() -> None:
    costs = {f"n{i}": float((i * 37) % 11) for i in range(20)}
    names = list(costs)
    first = priorities(costs, names)
    assert first == priorities(costs, names)
    by_cost = sorted(first, key=lambda e: costs[e["Host"]])
    scores = [e["Score"] for e in by_cost]
    assert scores == sorted(scores, reverse=True)
    assert all(1 <= s <= 10 for s in scores)


# ------------------------------------------------------------------ inventory


def a_slice(node: str, *, used: int = 0) -> dict[str, Any]:
    devices = [Device(f"GPU-{node}-{i}", i, "NVIDIA-A100", 40960) for i in range(2)]
    return slices.resource_slice(node, BACKEND, devices)


def a_claim(name: str, node: str, device: str, memory: str, cores: str = "0") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": claim_spec(),
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "nvidia.hami.io",
                            "pool": node,
                            "device": device,
                            "consumedCapacity": {"memory": memory, "cores": cores, "slots": "1"},
                        }
                    ]
                }
            }
        },
    }


def test_slice_devices_and_claim_holds() -> None:
    read = inventory.slice_devices(a_slice("n1"), DRIVERS)
    assert read is not None and read.node == "n1" and read.type_word == "nvidia"
    first = read.devices[0]
    assert (first.uuid, first.count, first.memory, first.cores, first.model) == (
        "nvidia-0",
        10,
        40960,
        100,
        "NVIDIA-A100",
    )
    assert inventory.slice_devices({"spec": {"driver": "x.io", "nodeName": "n"}}, DRIVERS) is None
    holds = inventory.claim_holds(a_claim("c", "n1", "nvidia-1", "40Gi", "30"), DRIVERS)
    use = holds.usage["n1"]["nvidia-1"]
    assert (use.slots, use.memory, use.cores) == (1, 40960, 30)
    assert holds.types == {"nvidia-1": "nvidia"}
    assert inventory.claim_holds({"metadata": {"name": "c"}}, DRIVERS).usage == {}


def test_bad_slice_device_and_claim_result_fail_closed() -> None:
    body = a_slice("n1")
    del body["spec"]["devices"][1]["capacity"]["memory"]
    read = inventory.slice_devices(body, DRIVERS)
    assert read is not None and [d.uuid for d in read.devices] == ["nvidia-0"]
    assert "ResourceSlice n1-nvidia-hami-io device 'nvidia-1': no memory capacity" in read.errors
    claim = a_claim("c", "n1", "nvidia-0", "3000Mi")
    del claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    holds = inventory.claim_holds(claim, DRIVERS)
    assert holds.usage["n1"]["nvidia-0"].cores == 100  # held whole
    assert "ResourceClaim ns/c result 0 (gpu)" in holds.errors[0]


# ------------------------------------------------------------------ the room


def score() -> DraScore:
    s = DraScore([KIND], CollectorRegistry())
    for node in ("n1", "n2"):
        s.on_slice("ADDED", a_slice(node))
    return s


def test_a_nodes_devices_follow_its_slices() -> None:
    """Two slices of one node add up; deleting one leaves the other's devices; deleting
    the last removes the node; a slice moved to another node leaves the first."""
    s = DraScore([KIND], CollectorRegistry())
    first = a_slice("n1")
    second = a_slice("n1")
    second["metadata"]["name"] = "n1-second"
    for device in second["spec"]["devices"]:
        device["name"] = device["name"] + "-b"
        device["attributes"]["uuid"] = {"string": device["attributes"]["uuid"]["string"] + "-b"}
    s.on_slice("ADDED", first)
    s.on_slice("ADDED", second)
    assert len(s.cluster.nodes["n1"].devices) == 4
    s.on_slice("DELETED", first)
    assert sorted(s.cluster.nodes["n1"].devices) == ["nvidia-0-b", "nvidia-1-b"]
    moved = {**second, "spec": {**second["spec"], "nodeName": "n2", "pool": {"name": "n2"}}}
    s.on_slice("MODIFIED", moved)
    assert "n1" not in s.cluster.nodes and len(s.cluster.nodes["n2"].devices) == 2
    s.on_slice("DELETED", moved)
    assert "n2" not in s.cluster.nodes


def args(body: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": body, "NodeNames": names}


def test_prefers_the_node_that_strands_less() -> None:
    s = score()
    whole = claim_template("whole", cores=100)
    half = claim_template("half", mem=20480, cores=50)
    s.on_template("ADDED", {**whole, "metadata": {"name": "whole", "namespace": "ns"}})
    s.on_template("ADDED", {**half, "metadata": {"name": "half", "namespace": "ns"}})
    # a whole-device pod was weighed before: it is in the workload window
    first = s.prioritize(args(pod(["whole"]), ["n1", "n2"]))
    assert [e["Score"] for e in first] == [10, 10]
    # n1's two devices each hold half; n2 is idle
    s.on_claim("ADDED", a_claim("x", "n1", "nvidia-0", "20Gi", "50"))
    s.on_claim("ADDED", a_claim("y", "n1", "nvidia-1", "20Gi", "50"))
    answer = s.prioritize(args(pod(["half"]), ["n1", "n2"]))
    assert answer == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 1}]
    # the claims go: nothing to choose between
    s.on_claim("DELETED", a_claim("x", "n1", "nvidia-0", "20Gi", "50"))
    s.on_claim("DELETED", a_claim("y", "n1", "nvidia-1", "20Gi", "50"))
    assert [e["Score"] for e in s.prioritize(args(pod(["half"]), ["n1", "n2"]))] == [10, 10]


def test_prioritize_bad_input_is_no_opinion() -> None:
    s = score()
    bad = {"metadata": {"name": "b", "namespace": "ns"}, "spec": {"resourceClaims": "x"}}
    zero = [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 0}]
    assert s.prioritize(args(bad, ["n1", "n2"])) == zero
    assert s.prioritize({"NodeNames": ["n1", "n2"]}) == zero  # no pod
    assert s.prioritize({"Pod": "x", "NodeNames": ["n1", "n2"]}) == zero
    assert s.prioritize("x") == []
    assert s.prioritize(args(pod(["missing"]), ["n1", "n2"])) == zero  # unknown yet
    assert s.prioritize(args(pod([]), ["n1", "n2"]), not_ready="syncing") == zero
    total = s.metrics.total
    assert s.prioritize(args(pod([]), ["n1"])) == [{"Host": "n1", "Score": 0}]  # no claim
    assert total.labels("invalid")._value.get() == 4
    assert total.labels("unknown_claim")._value.get() == 1
    assert total.labels("not_ready")._value.get() == 1
    assert total.labels("no_claim")._value.get() == 1


def test_node_room_from_nodes_and_pods() -> None:
    s = score()
    s.on_node("ADDED", {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "8"}}})
    bound = {
        "metadata": {"name": "busy", "namespace": "ns"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "6"}}}],
        },
    }
    s.on_pod("ADDED", bound)
    assert s.rooms.free("n1") == (2000, 0)
    s.on_pod("DELETED", bound)
    assert s.rooms.free("n1") == (8000, 0)


def test_config_dra_score_needs_a_dra_backend() -> None:
    with pytest.raises(config.ConfigError, match=r"scheduler\.dra_score: needs an enabled backend"):
        config.from_mapping({"scheduler": {"dra_score": True}}, env={})
    cfg = config.from_mapping(
        {
            "scheduler": {"dra_score": True},
            "backends": {"nvidia": {"enabled": False}, "fake": {"enabled": True, "mode": "dra"}},
        },
        env={},
    )
    assert cfg.scheduler.dra_score
