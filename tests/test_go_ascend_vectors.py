"""The Ascend cases of tests/data/go-vendor-vectors.json: what HAMi v2.10's own ascend device
functions returned (``GetNodeDevices``, ``MutateAdmission`` + ``GenerateResourceRequests``,
``PatchAnnotations``, ``Fit``) for every Ascend type of Go's chart, against this project's
Ascend backends (issue 24).

Both ways: a node annotated as HAMi's ascend-device-plugin annotates it is read here as Go
reads it; a container is taken, rewritten by the webhook (memory rounded up to its vNPU
template, a 910C device made a 2-NPU module) and asked for as Go's webhook and scheduler do;
the pod values are what the plug-in reads from Go; and a request gets the devices Go's Fit
gives it (templates decide what still fits, 910C only whole modules). The disagreements that
stay are listed in DELIBERATE with their reason; a listed case must still disagree and an
unlisted disagreement fails.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from _data import data_json
from _jsonpatch import apply_patch

from hami.backends import registry
from hami.backends.ascend import BACKENDS as ASCEND_CLASSES
from hami.backends.ascend import AscendBackend
from hami.core.fit import NodeFit, TypeView, fit_pod
from hami.core.requests import (
    DeviceKind,
    PodRequest,
    RequestError,
    asks_for,
    container_resources,
    parse_device_request,
    parse_quantity,
    parse_selectors,
)
from hami.core.usage import DeviceState
from hami.protocol import ContainerDevice, ProtocolError, encode_pod_devices
from hami.scheduler.webhook import mutations

ROOT = Path(__file__).resolve().parent.parent
GO: dict[str, Any] = data_json("go-vendor-vectors.json")
CASES = json.loads((ROOT / "tools/gohami-vectors/vendors/cases.json").read_text())
BACKENDS: dict[str, AscendBackend] = {}
for _word in ASCEND_CLASSES:
    _backend = registry.create(_word)  # through the entry point, with its defaults
    assert isinstance(_backend, AscendBackend)
    BACKENDS[_word] = _backend
KINDS = {word: DeviceKind.from_backend(b) for word, b in BACKENDS.items()}

REFUSED = (
    "a value that is not a whole number > 0 is refused with what to fix; Go's webhook "
    "rounds memory 0 up to the smallest template (protocol.md §3)"
)
DEFAULT_COUNT = (
    "memory without a count means scheduler.default_device_count devices, which the webhook "
    "writes (docs/interop.md 'Webhook'); Go's webhook leaves such a container alone"
)
REQUESTS_ONLY = (
    "a device named only in requests is taken by the webhook and its memory rounded (the API "
    "server refuses it anyway: extended resources need limits); Go's webhook reads limits only"
)
COUNT_ZERO = (
    "a count of 0 asks for nothing and the webhook writes nothing; Go's webhook writes the "
    "whole chip's memory into the container all the same"
)
SEVEN_FIELD = "one register reader for every type: the 7-field form is read for Ascend too"

DELIBERATE: dict[str, dict[str, str]] = {
    "nodes": {"Ascend910B3-not-json": SEVEN_FIELD},
    "containers": {
        "Ascend910B3-memory-zero": REFUSED,
        "Ascend910B3-memory-only": DEFAULT_COUNT,
        "Ascend910B3-requests-only": REQUESTS_ONLY,
        "Ascend910B3-count-zero": COUNT_ZERO,
    },
    "pod_values": {},
    "fits": {},
}


def _ascend(section: str) -> list[Any]:
    return [
        pytest.param(case, id=case["name"])
        for case in GO[section]
        if case["vendor"].startswith("Ascend")
    ]


def _judge(section: str, case: dict[str, Any], agrees: bool, detail: str) -> None:
    reason = DELIBERATE[section].get(case["name"])
    if reason is None:
        assert agrees, f"{case['name']} disagrees with Go HAMi: {detail}"
    else:
        assert not agrees, f"{case['name']} now agrees with Go; drop it from DELIBERATE ({reason})"


# ------------------------------------------------------------------ the file itself


def test_the_file_holds_exactly_the_committed_fit_inputs() -> None:
    fields = ("name", "vendor", "devices", "container")
    assert [{f: c[f] for f in fields} for c in GO["fits"]] == [
        {f: c[f] for f in fields} for c in CASES["fits"]
    ]


def test_every_type_of_gos_chart_is_a_backend_with_gos_keys_and_names() -> None:
    config = GO["about"]["config"]["ascend"]["Configs"]
    assert sorted(c["CommonWord"] for c in config) == sorted(BACKENDS)
    for chip in config:
        word = chip["CommonWord"]
        backend, kind, keys = BACKENDS[word], KINDS[word], GO["keys"]["ascend"][word]
        assert (backend.to_allocate_key, backend.allocated_key) == (
            keys["to_allocate"],
            keys["allocated"],
        )
        assert kind.heartbeat_keys() == (keys["handshake"],)
        assert kind.register_annotation() == f"hami.io/node-register-{word}"
        names = backend.resources
        assert (names.count, names.memory, names.cores) == (
            chip["ResourceName"],
            chip["ResourceMemoryName"],
            chip["ResourceCoreName"],
        )
        ours = backend.chip
        assert (ours.memory_allocatable, ours.memory_capacity, ours.super_pod) == (
            chip["MemoryAllocatable"],
            chip["MemoryCapacity"],
            chip["SuperPod"],
        )
        assert [(t.name, t.memory) for t in ours.templates] == sorted(
            ((t["Name"], t["Memory"]) for t in chip["Templates"]), key=lambda t: t[1]
        )


# ------------------------------------------------------------------ node reading


@pytest.mark.parametrize("case", _ascend("nodes"))
def test_nodes_are_read_as_go_reads_them(case: dict[str, Any]) -> None:
    backend = BACKENDS[case["vendor"]]
    try:
        found = backend.devices_from_node(case["node"]) or []
        ours = [
            (d.uuid, d.index, d.count, d.memory, d.cores, d.model, d.numa, d.healthy) for d in found
        ]
        detail = f"ours {ours}"
    except ProtocolError as exc:
        ours, detail = [], f"ours refused: {exc}"
    fields = ("id", "index", "count", "devmem", "devcore", "type", "numa", "health")
    go = [tuple(d[f] for f in fields) for d in case["go"]["devices"]]
    _judge("nodes", case, ours == go, f"{detail}; go {go} {case['go'].get('error', '')}")


# ------------------------------------------------------------------ webhook and requests


def _pod(case: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "default",
            "annotations": dict(case.get("pod_annotations") or {}),
        },
        "spec": {"containers": [copy.deepcopy(case["container"])]},
    }


def _ours(case: dict[str, Any]) -> tuple[bool, Any, dict[str, int]]:
    """Whether the webhook takes the container, the request (or its refusal) and the
    device resources the container has after the webhook."""
    kind = KINDS[case["vendor"]]
    pod = _pod(case)
    container = pod["spec"]["containers"][0]
    taken = asks_for(container, [kind])
    annotations = pod["metadata"]["annotations"]
    try:
        found = parse_device_request(container_resources(container), kind, "c", annotations)
        ops = mutations(pod, [kind], "hami-scheduler")
    except RequestError as exc:
        return taken, f"refused: {exc}", {}
    after = apply_patch(pod, ops)["spec"]["containers"][0]
    limits = (after.get("resources") or {}).get("limits") or {}
    written = {n: parse_quantity(v) for n, v in limits.items() if n in kind.resources.all()}
    if found is None:
        return taken, None, written
    return (
        taken,
        {
            "nums": found.count,
            "type": found.vendor,
            "memreq": found.memory,
            "mempercentagereq": found.memory_percentage or 0,
            "coresreq": found.cores,
        },
        written,
    )


@pytest.mark.parametrize("case", _ascend("containers"))
def test_containers_are_taken_rewritten_and_asked_for_as_go_does(case: dict[str, Any]) -> None:
    """Go's webhook (MutateAdmission) then its scheduler (GenerateResourceRequests on what
    the webhook wrote) against this project's webhook and request parsing."""
    go = case["go"]
    taken, request, written = _ours(case)
    names = KINDS[case["vendor"]].resources.all()
    go_taken = go["mutate"] or "mutate_error" in go
    if "mutate_error" in go:
        agrees = taken and isinstance(request, str)
        detail = f"ours {request}; go refused: {go['mutate_error']}"
    else:
        after = go["request_after"]
        go_request = after if after["nums"] > 0 else None
        go_written = {
            n: parse_quantity(v)
            for n, v in (go["mutated"].get("limits") or {}).items()
            if n in names
        }
        if go_request is None:
            go_written = {}  # no request: what the webhook wrote asks for nothing
        agrees = (taken, request) == (go_taken, go_request) and written == go_written
        detail = f"ours {taken} {request} {written}; go {go_taken} {go_request} {go_written}"
    _judge("containers", case, agrees, detail)


# ------------------------------------------------------------------ pod values


@pytest.mark.parametrize("case", _ascend("pod_values"))
def test_pod_values_are_written_as_go_writes_them(case: dict[str, Any]) -> None:
    """The devices values and ``huawei.com/{type}`` byte for byte; Go's ``predicate-time``
    (the time of the decision) is read by no HAMi component and is not written here."""
    kind = KINDS[case["vendor"]]
    containers = [
        [ContainerDevice(d["uuid"], d["type"], d["usedmem"], d["usedcores"]) for d in devices]
        for devices in case["containers"]
    ]
    index = {d["uuid"]: d["idx"] for devices in case["containers"] for d in devices}
    ours: dict[str, str] = {}
    if containers:
        value = encode_pod_devices(containers)
        ours = {kind.to_allocate_key: value, kind.allocated_key: value}
        assert kind.pod_annotations is not None
        ours.update(
            kind.pod_annotations(containers, index.__getitem__, case.get("pod_annotations") or {})
        )
    go = dict(case["go"]["annotations"])
    assert go.pop("predicate-time", "<unix seconds>") == "<unix seconds>"
    _judge("pod_values", case, ours == go, f"ours {ours}; go {go}")


# ------------------------------------------------------------------ placement


def _states(case: dict[str, Any]) -> list[DeviceState]:
    return [
        DeviceState(
            uuid=d["id"],
            index=d["index"],
            model=case["vendor"],
            numa=0,
            healthy=d["health"],
            count=d["count"],
            total_memory=d["totalmem"],
            total_cores=d["totalcore"],
            used=d["used"],
            used_memory=d["usedmem"],
            used_cores=d["usedcores"],
        )
        for d in case["devices"]
    ]


@pytest.mark.parametrize("case", _ascend("fits"))
def test_requests_get_the_devices_gos_fit_gives(case: dict[str, Any]) -> None:
    """Fit or not as Go's Fit decides, and where Go fits, devices Go could have given (Go
    picks among equally whole 910C modules in map order: every answer it gave is listed),
    each with the memory Go gives."""
    kind = KINDS[case["vendor"]]
    annotations = case.get("pod_annotations") or {}
    resources = container_resources(case["container"])
    go = case["go"]
    try:
        request = parse_device_request(resources, kind, "c", annotations)
    except RequestError as exc:
        assert "mutate_error" in go, f"ours refused ({exc}), Go took it"
        return
    assert "mutate_error" not in go, "Go refused the container, ours took it"
    assert request is not None
    assert (request.count, request.memory) == (go["request"]["nums"], go["request"]["memreq"])
    # the whole pod on the node, so that the node's annotations count (hami-vnpu-core)
    word = case["vendor"]
    offers = kind.node_offers(case.get("node_annotations") or {}) if kind.node_offers else None
    view = TypeView(_states(case), offers=offers)
    pod = PodRequest(((request,),), 0, {word: parse_selectors(annotations, kind)})
    placed = fit_pod({word: view}, pod, "spread")
    ours = (
        sorted((d.uuid, d.memory) for d in placed.assignment[word][0])
        if isinstance(placed, NodeFit)
        else None
    )
    answers = [
        sorted((d["uuid"], d["usedmem"]) for d in a["devices"]) if a["fits"] else None
        for a in go["answers"]
    ]
    _judge("fits", case, ours in answers, f"ours {ours}; go {answers}")
