"""``hami explain`` in DRA mode, the pure reasoning (no API server): a pod's claims against
the published ResourceSlices and the allocated claims (hami.dra.explainpod over claimasks,
devicepicture and whynot), and the printed answer. Issue 22 item 6."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.backends.base import BackendSettings, Device
from hami.backends.fake import FakeBackend
from hami.core.requests import DeviceKind, parse_pod
from hami.dra import slices
from hami.dra.claimasks import Toleration
from hami.dra.devicepicture import Taint
from hami.dra.explainpod import explain_pod
from hami.dra.whynot import tolerated
from hami.scheduler import explain_cli
from hami.scheduler.explain import waits_on_claims
from hami.testkit.dra_pods import claim_spec, claim_template, dra_pod, percent_template

A100 = "NVIDIA-A100-SXM4-40GB"
T4 = "NVIDIA-Tesla T4"


def a_slice(
    node: str, count: int = 2, model: str = A100, memory: int = 40960, split: int = 10
) -> dict[str, Any]:
    backend = FakeBackend(BackendSettings(split_count=split))
    devices = [Device(f"GPU-{node}-{i}", i, model, memory) for i in range(count)]
    return slices.resource_slice(node, backend, devices)


def held(name: str, node: str, device: str, memory: str | None, cores: str = "0") -> dict[str, Any]:
    """An allocated claim of another pod holding ``memory`` (None: no consumed capacity)."""
    result: dict[str, Any] = {
        "request": "gpu",
        "driver": "nvidia.hami.io",
        "pool": node,
        "device": device,
    }
    if memory is not None:
        result["consumedCapacity"] = {"memory": memory, "cores": cores, "slots": "1"}
    return {
        "metadata": {"name": name, "namespace": "other"},
        "spec": claim_spec(),
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def pending(templates: list[str], *, made: bool = True) -> dict[str, Any]:
    """A Pending pod of ``templates``; when ``made``, its status names the claims the
    resourceclaim controller made (``explain`` writes them, not allocated)."""
    pod = dra_pod("p", templates)
    pod["metadata"]["namespace"] = "ns"
    if made:
        pod["status"] = {
            "phase": "Pending",
            "resourceClaimStatuses": [
                {"name": f"gpu{i}", "resourceClaimName": f"p-gpu{i}-x"}
                for i in range(len(templates))
            ],
        }
    return pod


def explain(
    pod: dict[str, Any],
    templates: list[dict[str, Any]],
    slice_list: list[Any],
    others: Sequence[Any] = (),
    nodes: Sequence[str] = (),
) -> dict[str, Any]:
    """The answer, with the pod's own claims made from ``templates`` when its status
    names them."""
    index = {("ns", t["metadata"]["name"]): t for t in templates}
    claims = list(others)
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        ref = next(r for r in pod["spec"]["resourceClaims"] if r["name"] == status["name"])
        template = index[("ns", ref["resourceClaimTemplateName"])]
        claims.append(
            {
                "metadata": {"name": status["resourceClaimName"], "namespace": "ns"},
                "spec": copy.deepcopy(template["spec"]["spec"]),
            }
        )
    answer = explain_pod(pod, claims, index, slice_list, nodes)
    assert answer is not None
    return answer


# ------------------------------------------------------------------ the shortfalls


def test_memory_shortfall_names_node_device_claim_and_amounts() -> None:
    pod = pending(["t8000"])
    others = [
        held("a", "n1", "nvidia-0", "38960Mi"),
        held("b", "n1", "nvidia-1", "40960Mi"),
    ]
    answer = explain(pod, [claim_template("t8000", mem=8000)], [a_slice("n1")], others)
    assert answer["error"] == ""
    assert answer["requests"] == ["claim p-gpu0-x request 'gpu'"]
    lines = answer["details"]["n1"]
    assert "GPU-n1-0 has 2000 MiB free, claim p-gpu0-x request 'gpu' asks 8000 MiB" in lines
    assert "GPU-n1-1 has 0 MiB free, claim p-gpu0-x request 'gpu' asks 8000 MiB" in lines
    assert answer["nodes"]["n1"] == "; ".join(lines)


def test_a_node_with_room_fits_and_the_others_say_why_not() -> None:
    pod = pending(["t8000"])
    others = [held("a", "n1", "nvidia-0", "40Gi"), held("b", "n1", "nvidia-1", "40Gi")]
    answer = explain(
        pod, [claim_template("t8000", mem=8000)], [a_slice("n1"), a_slice("n2")], others
    )
    assert answer["nodes"]["n2"] == "fits"
    assert answer["details"]["n2"] == []
    assert answer["details"]["n1"][0] == "every one of the node's 2 hami devices is fully used"


def test_more_than_any_device_has() -> None:
    pod = pending(["big"])
    answer = explain(pod, [claim_template("big", mem=64000)], [a_slice("n1", count=1)])
    assert answer["details"]["n1"] == [
        "GPU-n1-0 has 40960 MiB in all, claim p-gpu0-x request 'gpu' asks 64000 MiB"
    ]


def test_cores_shortfall() -> None:
    pod = pending(["c30"])
    others = [held("a", "n1", "nvidia-0", "1000Mi", cores="80")]
    answer = explain(pod, [claim_template("c30", mem=1000, cores=30)], [a_slice("n1", 1)], others)
    assert answer["details"]["n1"] == [
        "GPU-n1-0 has 20% cores free, claim p-gpu0-x request 'gpu' asks 30%"
    ]


def test_memory_and_cores_short_on_one_device_are_one_line() -> None:
    pod = pending(["both"])
    others = [held("a", "n1", "nvidia-0", "40000Mi", cores="90")]
    answer = explain(pod, [claim_template("both", mem=2000, cores=30)], [a_slice("n1", 1)], others)
    (line,) = answer["details"]["n1"]
    assert "has 960 MiB free" in line and "has 10% cores free" in line


def test_share_slots_all_taken() -> None:
    pod = pending(["small"])
    others = [held(f"c{i}", "n1", "nvidia-0", "100Mi") for i in range(2)]
    answer = explain(pod, [claim_template("small", mem=100)], [a_slice("n1", 1, split=2)], others)
    assert answer["details"]["n1"] == [
        "every one of the node's 1 hami devices is fully used",
        "GPU-n1-0 has all 2 share slots taken (2 claims), claim p-gpu0-x request 'gpu' needs one",
    ]


def test_no_memory_named_asks_the_whole_device() -> None:
    pod = pending(["whole"])
    others = [held("a", "n1", "nvidia-0", "1000Mi")]
    answer = explain(pod, [claim_template("whole")], [a_slice("n1", 1)], others)
    assert answer["details"]["n1"] == [
        "GPU-n1-0 has 39960 MiB free, claim p-gpu0-x request 'gpu' asks the whole device "
        "(40960 MiB: no memory named)"
    ]


def test_device_allocated_whole_by_a_result_without_consumed_capacity() -> None:
    pod = pending(["small"])
    others = [held("w", "n1", "nvidia-0", None)]
    answer = explain(pod, [claim_template("small", mem=100)], [a_slice("n1", 1)], others)
    assert answer["details"]["n1"][-1] == (
        "GPU-n1-0 is allocated whole to claim other/w, claim p-gpu0-x request 'gpu' cannot share it"
    )
    # the unreadable hold is named too
    assert any("ResourceClaim other/w" in e for e in answer["object_errors"])


def test_unshared_device_already_allocated() -> None:
    body = a_slice("n1", 1)
    del body["spec"]["devices"][0]["allowMultipleAllocations"]
    pod = pending(["small"])
    others = [held("u", "n1", "nvidia-0", "100Mi")]
    answer = explain(pod, [claim_template("small", mem=100)], [body], others)
    assert answer["details"]["n1"][-1] == (
        "GPU-n1-0 is not shared and already allocated to claim other/u"
    )


def test_model_selector_names_the_model() -> None:
    pod = pending(["t4"])
    answer = explain(
        pod,
        [claim_template("t4", mem=1000, model="T4")],
        [a_slice("a100", 1), a_slice("t4", 1, model=T4, memory=15360)],
    )
    assert answer["nodes"]["t4"] == "fits"
    assert answer["details"]["a100"] == [
        f"GPU-a100-0 is a {A100}, claim p-gpu0-x request 'gpu' asks a model containing 't4'"
    ]
    assert answer["notes"] == []  # the model selector is read, nothing left unjudged


def test_excluded_model() -> None:
    template = claim_template("not-a100", mem=1000)
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    request["selectors"] = [
        {"cel": {"expression": '!device.attributes["nvidia.hami.io"].model.contains("A100")'}}
    ]
    pod = pending(["not-a100"])
    answer = explain(pod, [template], [a_slice("n1", 1)])
    assert answer["details"]["n1"] == [
        f"GPU-n1-0 is a {A100}, claim p-gpu0-x request 'gpu' excludes 'a100'"
    ]


def tainted(effect: str) -> dict[str, Any]:
    body = a_slice("n1", 1)
    body["spec"]["devices"][0]["taints"] = [
        {"key": "gpu.hami.io/xid", "value": "79", "effect": effect}
    ]
    return body


def test_untolerated_device_taint() -> None:
    pod = pending(["small"])
    answer = explain(pod, [claim_template("small", mem=100)], [tainted("NoSchedule")])
    assert answer["details"]["n1"] == [
        "GPU-n1-0 has the taint gpu.hami.io/xid=79:NoSchedule, which claim p-gpu0-x "
        "request 'gpu' does not tolerate"
    ]


def test_tolerated_or_informational_taint_fits() -> None:
    template = claim_template("tol", mem=100)
    exact = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exact["tolerations"] = [{"key": "gpu.hami.io/xid", "operator": "Exists"}]
    pod = pending(["tol"])
    assert explain(pod, [template], [tainted("NoExecute")])["nodes"]["n1"] == "fits"
    pod = pending(["small"])
    assert explain(pod, [claim_template("small", mem=100)], [tainted("None")])["nodes"] == {
        "n1": "fits"
    }


@pytest.mark.parametrize(
    ("toleration", "ok"),
    [
        (Toleration("", "Exists", "", ""), True),
        (Toleration("k", "Exists", "", "NoSchedule"), True),
        (Toleration("k", "Exists", "", "NoExecute"), False),
        (Toleration("k", "Equal", "v", ""), True),
        (Toleration("k", "Equal", "w", ""), False),
        (Toleration("j", "Exists", "", ""), False),
    ],
)
def test_toleration_match(toleration: Toleration, ok: bool) -> None:
    assert tolerated([toleration], Taint("k", "v", "NoSchedule")) is ok


def test_count_of_distinct_devices_short() -> None:
    pod = pending(["two"])
    others = [held("a", "n1", "nvidia-1", "40000Mi")]
    answer = explain(pod, [claim_template("two", count=2, mem=8000)], [a_slice("n1")], others)
    assert answer["details"]["n1"] == [
        "claim p-gpu0-x request 'gpu' asks 2 devices, 1 can take it",
        "GPU-n1-1 has 960 MiB free, claim p-gpu0-x request 'gpu' asks 8000 MiB",
    ]
    # without distinctAttribute one shared device may serve both
    template = claim_template("two-any", count=2, mem=8000)
    del template["spec"]["spec"]["devices"]["constraints"]
    pod = pending(["two-any"])
    assert explain(pod, [template], [a_slice("n1")], others)["nodes"]["n1"] == "fits"


def test_requests_that_fit_alone_but_not_together() -> None:
    pod = pending(["t30k", "t30k"])
    template = claim_template("t30k", mem=30000)
    answer = explain(pod, [template], [a_slice("one", 1), a_slice("two", 2)])
    assert answer["nodes"]["two"] == "fits"
    assert answer["details"]["one"] == [
        "each request fits alone, but not all together on its devices "
        "(claim p-gpu0-x request 'gpu', claim p-gpu1-x request 'gpu')"
    ]


def test_first_available_every_choice_is_explained() -> None:
    template = percent_template("half", {"H100": 40960, "A100": 20480}, 50)
    pod = pending(["half"])
    others = [held("a", "n1", "nvidia-0", "35000Mi")]
    answer = explain(pod, [template], [a_slice("n1", 1)], others)
    assert answer["details"]["n1"] == [
        f"GPU-n1-0 is a {A100}, claim p-gpu0-x request 'gpu' subrequest 'm0' asks a model "
        "containing 'h100'",
        "GPU-n1-0 has 5960 MiB free, claim p-gpu0-x request 'gpu' subrequest 'm1' asks 10240 MiB",
    ]
    assert explain(pod, [template], [a_slice("n1", 1)])["nodes"]["n1"] == "fits"


def test_node_without_hami_devices_and_claim_from_template() -> None:
    pod = pending(["small"], made=False)
    answer = explain(pod, [claim_template("small", mem=100)], [a_slice("n1")], nodes=["cpu-only"])
    label = "claim gpu0 (not made yet, from ResourceClaimTemplate ns/small) request 'gpu'"
    assert answer["requests"] == [label]
    assert answer["nodes"]["n1"] == "fits"
    assert answer["details"]["cpu-only"] == [
        f"the node publishes no nvidia.hami.io devices, {label} asks them"
    ]


def test_allocated_claim_pins_the_pod() -> None:
    pod = pending(["small"])
    pod["spec"]["nodeName"] = "n1"
    pod["status"]["phase"] = "Running"
    mine = held("p-gpu0-x", "n1", "nvidia-0", "100Mi")
    mine["metadata"]["namespace"] = "ns"
    results = mine["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "device": "nvidia-1"})
    answer = explain_pod(pod, [mine], {}, [a_slice("n1"), a_slice("n2")])
    assert answer is not None
    assert answer["assigned"] == "n1"
    assert answer["allocated"] == [
        {"claim": "claim p-gpu0-x", "node": "n1", "devices": ["nvidia-0", "nvidia-1"]}
    ]
    assert answer["nodes"]["n1"] == "fits"
    assert answer["nodes"]["n2"] == (
        "claim p-gpu0-x is allocated on node n1 (nvidia-0, nvidia-1): the pod can only go there"
    )


def test_notes_for_what_hami_does_not_judge() -> None:
    template = claim_template("cel", mem=100)
    spec = template["spec"]["spec"]
    spec["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": 'device.attributes["nvidia.hami.io"].numa == 0'}}
    ]
    spec["devices"]["constraints"] = [{"matchAttribute": "nvidia.hami.io/numa"}]
    spec["devices"]["requests"].append(
        {
            "name": "watch",
            "exactly": {"deviceClassName": "nvidia.hami.io", "adminAccess": True},
        }
    )
    pod = pending(["cel"])
    answer = explain(pod, [template], [a_slice("n1")])
    assert answer["nodes"]["n1"] == "fits"
    assert answer["notes"] == [
        "claim p-gpu0-x: matchAttribute nvidia.hami.io/numa over * is not judged by hami",
        "claim p-gpu0-x request 'gpu': selector "
        "'device.attributes[\"nvidia.hami.io\"].numa == 0' is not judged by hami",
        "claim p-gpu0-x request 'watch': adminAccess holds nothing; not judged",
    ]


def test_older_pool_generation_is_ignored() -> None:
    old = a_slice("n1", 1, model=T4)
    old["metadata"]["name"] = "old"
    new = a_slice("n1", 1)
    new["spec"]["pool"]["generation"] = 1
    pod = pending(["a100"])
    answer = explain(pod, [claim_template("a100", mem=100, model="A100")], [old, new])
    assert answer["nodes"]["n1"] == "fits"


# ------------------------------------------------------------------ not this mode's pod


def test_pods_without_hami_claims_are_not_answered() -> None:
    assert explain_pod({"metadata": {"name": "p"}, "spec": {}}, [], {}, []) is None
    pod = pending(["other"], made=False)
    template = claim_template("other", mem=100, device_class="gpu.example.com")
    assert explain_pod(pod, [], {("ns", "other"): template}, [a_slice("n1")]) is None


# ------------------------------------------------------------------ malformed objects


def test_missing_template_or_claim_is_an_error_naming_it() -> None:
    pod = pending(["gone"], made=False)
    answer = explain_pod(pod, [], {}, [a_slice("n1")])
    assert answer == {
        "pod": "ns/p",
        "mode": "dra",
        "error": "pod ns/p: ResourceClaimTemplate ns/gone does not exist",
        "nodes": {},
    }
    pod["spec"]["resourceClaims"] = [{"name": "gpu0", "resourceClaimName": "shared"}]
    answer = explain_pod(pod, [], {}, [])
    assert answer is not None
    assert answer["error"] == "pod ns/p: ResourceClaim ns/shared does not exist"


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda e: e.update(count=0), "count 0 is not a whole number >= 1"),
        (lambda e: e.update(capacity={"requests": {"memory": "lots"}}), "memory 'lots'"),
        (lambda e: e.update(capacity={"requests": {"cores": "300"}}), "cores '300'"),
        (lambda e: e.update(tolerations="all"), "tolerations is not a list"),
        (lambda e: e.update(allocationMode="All"), "allocationMode All"),
    ],
)
def test_malformed_claim_is_an_error_naming_pod_claim_and_request(mutate: Any, words: str) -> None:
    template = claim_template("bad", mem=100)
    mutate(template["spec"]["spec"]["devices"]["requests"][0]["exactly"])
    pod = pending(["bad"])
    answer = explain(pod, [template], [a_slice("n1")])
    assert answer["error"].startswith("pod ns/p: ResourceClaim ns/p-gpu0-x"), answer
    assert words in answer["error"]
    assert "request 'gpu'" in answer["error"]


def test_one_bad_claim_leaves_the_others_judged() -> None:
    bad = claim_template("bad", mem=100)
    bad["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = -1
    pod = pending(["bad", "good"])
    answer = explain(pod, [bad, claim_template("good", mem=100)], [a_slice("n1")])
    assert answer["error"] == ""
    assert answer["requests"] == ["claim p-gpu1-x request 'gpu'"]
    assert answer["nodes"]["n1"] == "fits"
    (error,) = answer["object_errors"]
    assert "ResourceClaim ns/p-gpu0-x request 'gpu': count -1" in error


def test_malformed_slice_device_is_named_and_left_out() -> None:
    body = a_slice("n1")
    body["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["default"] = "much"
    body["spec"]["devices"][1]["taints"] = [{"effect": "NoSchedule"}]
    pod = pending(["small"])
    answer = explain(pod, [claim_template("small", mem=100)], [body, a_slice("n2")])
    assert answer["nodes"]["n2"] == "fits"
    assert answer["details"]["n1"] == [
        "the node publishes no nvidia.hami.io devices, claim p-gpu0-x request 'gpu' asks them"
    ]
    errors = answer["object_errors"]
    assert any(
        e.startswith("ResourceSlice n1-nvidia-hami-io device 'nvidia-0': capacity unreadable")
        for e in errors
    ), errors
    assert "ResourceSlice n1-nvidia-hami-io device 'nvidia-1': taint 0 has no key" in errors


def test_claim_result_without_pool_is_named() -> None:
    bad = held("x", "n1", "nvidia-0", "100Mi")
    del bad["status"]["allocation"]["devices"]["results"][0]["pool"]
    pod = pending(["small"])
    answer = explain(pod, [claim_template("small", mem=100)], [a_slice("n1")], [bad])
    assert answer["nodes"]["n1"] == "fits"
    assert any("ResourceClaim other/x result 0" in e for e in answer["object_errors"])


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _replace(value: Any, path: tuple[Any, ...], junk: Any) -> None:
    for step in path[:-1]:
        value = value[step]
    value[path[-1]] = junk


@settings(max_examples=300, deadline=None)
@given(which=st.integers(0, 3), at=st.integers(0, 10_000), junk=JUNK)
def test_any_malformed_field_never_crashes(which: int, at: int, junk: Any) -> None:
    """Any one field of the slice, the held claim, the template or the pod replaced by
    junk: an answer (maybe an error), never an exception."""
    template = claim_template("t", count=2, mem=8000, cores=10)
    pod = pending(["t"])
    objects: list[Any] = [a_slice("n1"), held("h", "n1", "nvidia-0", "100Mi"), template, pod]
    target = objects[which]
    paths = _paths(target)
    _replace(target, paths[at % len(paths)], junk)
    slice_body, other, template, pod = objects
    claims = [other, {"metadata": {"name": "p-gpu0-x", "namespace": "ns"}, "spec": claim_spec()}]
    answer = explain_pod(pod, claims, {("ns", "t"): template}, [slice_body, "junk"], ["n1"])
    if answer is not None:
        assert isinstance(answer["nodes"], dict)
        explain_cli.print_answer(answer)


# ------------------------------------------------------------------ printed


def test_printed_answer_lists_each_reason(capsys: pytest.CaptureFixture[str]) -> None:
    pod = pending(["t8000"])
    others = [held("a", "n1", "nvidia-0", "38960Mi"), held("b", "n1", "nvidia-1", "40Gi")]
    answer = explain(
        pod, [claim_template("t8000", mem=8000)], [a_slice("n1"), a_slice("n2")], others
    )
    answer["scheduler_message"] = "0/2 nodes are available: 1 cannot allocate all claims."
    explain_cli.print_answer(answer)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "pod ns/p"
    assert out[1] == "waits on: claim p-gpu0-x request 'gpu'"
    assert out[2].split() == ["NODE", "REASON"]
    assert out[3] == "n1    GPU-n1-0 has 2000 MiB free, claim p-gpu0-x request 'gpu' asks 8000 MiB"
    assert out[4] == "      GPU-n1-1 has 0 MiB free, claim p-gpu0-x request 'gpu' asks 8000 MiB"
    assert out[5] == "n2    fits"
    assert out[-1] == "kube-scheduler says: 0/2 nodes are available: 1 cannot allocate all claims."


def test_a_pod_with_claims_and_hami_limits_is_the_extenders() -> None:
    kinds = [DeviceKind.from_backend(FakeBackend(BackendSettings()))]

    def parse(pod: Mapping[str, Any]) -> Any:
        return parse_pod(pod, kinds)

    pod = pending(["small"])
    assert waits_on_claims(pod, parse)
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    assert not waits_on_claims(pod, parse)
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "-1"}
    assert not waits_on_claims(pod, parse)  # unreadable: the extender's answer says why
    del pod["spec"]["resourceClaims"]
    assert not waits_on_claims(pod, parse)


def test_a_pool_not_named_after_its_node() -> None:
    """Another writer's pool name: holds and allocations are placed by the slice's
    nodeName and the allocation's nodeSelector, not by the pool's name."""
    body = a_slice("n1", 1)
    body["spec"]["pool"]["name"] = "extra"
    other = held("a", "extra", "nvidia-0", "40000Mi")
    pod = pending(["t8000"])
    answer = explain(pod, [claim_template("t8000", mem=8000)], [body], [other])
    assert answer["details"]["n1"] == [
        "GPU-n1-0 has 960 MiB free, claim p-gpu0-x request 'gpu' asks 8000 MiB"
    ]
    mine = held("p-gpu0-x", "extra", "nvidia-0", "100Mi")
    mine["metadata"]["namespace"] = "ns"
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    mine["status"]["allocation"]["nodeSelector"] = {"nodeSelectorTerms": [term]}
    answer = explain_pod(pod, [mine], {}, [body, a_slice("n2", 1)])
    assert answer is not None
    assert answer["allocated"] == [
        {"claim": "claim p-gpu0-x", "node": "n1", "devices": ["nvidia-0"]}
    ]
    assert answer["nodes"]["n1"] == "fits"


def test_an_over_committed_device_reads_full() -> None:
    pod = pending(["small"])
    others = [held("a", "n1", "nvidia-0", "50000Mi", cores="120")]
    answer = explain(pod, [claim_template("small", mem=100, cores=10)], [a_slice("n1", 1)], others)
    assert answer["details"]["n1"] == [
        "every one of the node's 1 hami devices is fully used",
        "GPU-n1-0 has 0 MiB free, claim p-gpu0-x request 'gpu' asks 100 MiB; "
        "GPU-n1-0 has 0% cores free, claim p-gpu0-x request 'gpu' asks 10%",
    ]
