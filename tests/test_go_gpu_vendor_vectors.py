"""The Iluvatar, Moore Threads, Kunlunxin and MetaX cases of tests/data/go-vendor-vectors.json
(issue 24): what HAMi v2.10's own device functions returned (``GetNodeDevices``,
``MutateAdmission`` + ``GenerateResourceRequests``, ``PatchAnnotations``, ``Fit``) for each
type of Go's chart, against this project's backends found through their entry points.

Both ways: a node annotated as the vendor's plug-in annotates it is read here as Go reads it;
a container is taken, rewritten by the webhook (resources and environment) and asked for as
Go's webhook and scheduler do; the pod values are what the plug-in reads from Go; and a
request gets the devices Go's Fit gives it. The disagreements that stay are listed in
DELIBERATE with their reason; a listed case must still disagree and an unlisted disagreement
fails.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from _data import data_json
from _jsonpatch import apply_patch

from hami.backends import registry
from hami.backends.base import Backend, BackendError
from hami.backends.iluvatar import BACKENDS as ILUVATAR_CLASSES
from hami.backends.iluvatar import IluvatarBackend
from hami.backends.kunlun import KunlunBackend, XpuBackend
from hami.backends.metax import MetaxGpuBackend, MetaxSgpuBackend
from hami.backends.mthreads import MthreadsBackend
from hami.core.fit import fit_container
from hami.core.requests import (
    DeviceKind,
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

GO: dict[str, Any] = data_json("go-vendor-vectors.json")
WORDS = (*ILUVATAR_CLASSES, "mthreads", "kunlun", "XPU", "Metax-GPU", "Metax-SGPU")
BACKENDS: dict[str, Backend] = {word: registry.create(word) for word in WORDS}
KINDS = {word: DeviceKind.from_backend(b) for word, b in BACKENDS.items()}
WHOLE = 100  # Go's Fit gives a device at most 100 % of its cores

REFUSED = (
    "a value that is not a whole number > 0 is refused with what to fix (protocol.md §3); Go "
    "reads vMem 0 as the whole device and drops a request whose vMem is negative or a fraction"
)
CORES_OVER = (
    "one device with vCore above 100 is refused with what to fix; Go keeps the value and its "
    "Fit gives the device 100 %"
)
DEFAULT_COUNT = (
    "memory without a count means scheduler.default_device_count devices, which the webhook "
    "writes (docs/interop.md 'Webhook'); Go's webhook leaves such a container alone"
)
REQUESTS_ONLY = (
    "a device named only in requests is taken by the webhook (the API server refuses it anyway: "
    "extended resources need limits); Go's webhook reads limits only"
)
JSON_READ = (
    "one register reader for every type: the JSON form is read for Iluvatar too, where Go "
    "reads only the 7-field form its plug-in writes"
)

DELIBERATE: dict[str, dict[str, str]] = {
    "nodes": {"iluvatar-BI-V150-json-form": JSON_READ},
    "containers": {
        "iluvatar-BI-V150-memory-zero": REFUSED,
        "iluvatar-BI-V150-memory-negative": REFUSED,
        "iluvatar-BI-V150-memory-fraction": REFUSED,
        "iluvatar-BI-V150-cores-150": CORES_OVER,
        "iluvatar-BI-V150-memory-only": DEFAULT_COUNT,
        "iluvatar-BI-V150-requests-only": REQUESTS_ONLY,
    },
    "pod_values": {},
    "fits": {},
}
# Moore Threads' count 0 or below: Go's webhook refuses the pod; here a count of 0 asks for
# nothing (as for every vendor), a negative one is refused.
DELIBERATE["containers"]["mthreads-count-zero"] = (
    "a count of 0 asks for nothing here (every vendor alike); Go's webhook refuses the pod"
)
DELIBERATE["containers"]["mthreads-cores-17"] = (
    "one device with sgpu-core above 16 (a whole card) is refused with what to fix; Go takes "
    "it and no card ever fits it"
)
DELIBERATE["containers"]["mthreads-memory-only"] = DEFAULT_COUNT
# What Go's Moore Threads PatchAnnotations writes that no pod value here carries, and back:
# mthreads.com/predicate-time (the time of the decision) and mthreads.com/predicate-node (the
# node) are not written yet (backends' pod annotations see neither); the to-allocate key,
# which Go registers but does not write for Moore Threads, is written as for every vendor.
NOT_WRITTEN = ("mthreads.com/predicate-time", "mthreads.com/predicate-node")
# Kunlunxin: the webhook's refusals and defaults as for every vendor.
DELIBERATE["containers"].update(
    {
        "kunlun-requests-only": REQUESTS_ONLY,
        "xpu-requests-only": REQUESTS_ONLY,
        "xpu-memory-only": DEFAULT_COUNT,
        "xpu-memory-zero": REFUSED,
    }
)
# MetaX: as for every vendor, and Go's sGPU request rules.
DELIBERATE["containers"].update(
    {
        "metax-gpu-requests-only": REQUESTS_ONLY,
        "metax-sgpu-requests-only": REQUESTS_ONLY,
        "metax-sgpu-memory-only": DEFAULT_COUNT,
        "metax-sgpu-memory-zero": REFUSED,
        "metax-sgpu-count-negative": REFUSED,
        "metax-sgpu-cores-150": (
            "vcore above 100 is refused with what to fix; Go takes it and no GPU fits it"
        ),
    }
)
# MetaX's metax-tech.com/predicate-time (the time of the decision) is not written (as for
# Moore Threads, a backend's pod annotations see no clock).
METAX_NOT_WRITTEN = "metax-tech.com/predicate-time"
# Go's whole-card kunlun type registers no to-allocate key and writes none; it is written
# here as for every vendor.
NO_TO_ALLOCATE = ("mthreads", "kunlun")


def _as_placed(vendor: str, request: dict[str, Any]) -> dict[str, Any]:
    """Go's Kunlunxin request as its Fit places it: a ``kunlun`` card is given whole (Go
    asks 0 cores and its Fit gives each card all of them, 100 %); an ``XPU`` request with
    no memory asks 100 % of the memory (Go writes a card's 98304 MiB beside the 100 %,
    and its Fit gives that)."""
    if vendor == "kunlun" and request["nums"] > 0:
        return {**request, "coresreq": WHOLE}
    if vendor == "XPU" and request["mempercentagereq"] == WHOLE:
        return {**request, "memreq": 0}
    return request


def _cases(section: str) -> list[Any]:
    return [
        pytest.param(case, id=case["name"]) for case in GO[section] if case["vendor"] in BACKENDS
    ]


def _judge(section: str, case: dict[str, Any], agrees: bool, detail: str) -> None:
    reason = DELIBERATE[section].get(case["name"])
    if reason is None:
        assert agrees, f"{case['name']} disagrees with Go HAMi: {detail}"
    else:
        assert not agrees, f"{case['name']} now agrees with Go; drop it from DELIBERATE ({reason})"


# ------------------------------------------------------------------ keys and names


def test_every_iluvatar_type_of_gos_chart_is_a_backend_with_gos_keys_and_names() -> None:
    config = GO["about"]["config"]["iluvatar"]
    assert sorted(c["CommonWord"] for c in config) == sorted(ILUVATAR_CLASSES)
    for chip in config:
        word = chip["CommonWord"]
        backend, kind, keys = BACKENDS[word], KINDS[word], GO["keys"]["iluvatar"][word]
        assert isinstance(backend, IluvatarBackend)
        assert (backend.to_allocate_key, backend.allocated_key) == (
            keys["to_allocate"],
            keys["allocated"],
        )
        assert kind.heartbeat_keys() == (keys["handshake"],)
        assert kind.register_annotation() == f"hami.io/node-{word}-register"
        assert (kind.annotation("use-uuid"), kind.annotation("nouse-uuid")) == (
            f"hami.io/use-{word}-uuid",
            f"hami.io/no-use-{word}-uuid",
        )
        names = backend.resources
        assert (names.count, names.memory, names.cores, names.memory_unit_mib) == (
            chip["ResourceCountName"],
            chip["ResourceMemoryName"],
            chip["ResourceCoreName"],
            256,
        )


def test_moore_threads_has_gos_keys_and_names() -> None:
    backend, kind = BACKENDS["mthreads"], KINDS["mthreads"]
    assert isinstance(backend, MthreadsBackend)
    keys, config = GO["keys"]["mthreads"]["Mthreads"], GO["about"]["config"]["mthreads"]
    assert (backend.to_allocate_key, backend.allocated_key, backend.vendor_word) == (
        keys["to_allocate"],
        keys["allocated"],
        "Mthreads",
    )
    names = backend.resources
    assert (names.count, names.memory, names.cores, names.memory_unit_mib) == (
        config["resourceCountName"],
        config["resourceMemoryName"],
        config["resourceCoreName"],
        512,
    )
    assert (kind.annotation("use-uuid"), kind.annotation("nouse-uuid")) == (
        "mthreads.ai/use-gpuuuid",
        "mthreads.ai/nouse-gpuuuid",
    )


def test_kunlunxin_has_gos_keys_and_names() -> None:
    keys, config = GO["keys"]["kunlun"], GO["about"]["config"]["kunlun"]
    whole, shared = BACKENDS["kunlun"], BACKENDS["XPU"]
    assert isinstance(whole, KunlunBackend) and isinstance(shared, XpuBackend)
    assert whole.allocated_key == keys["kunlun"]["allocated"]
    assert (shared.to_allocate_key, shared.allocated_key) == (
        keys["XPU"]["to_allocate"],
        keys["XPU"]["allocated"],
    )
    assert KINDS["XPU"].heartbeat_keys() == (keys["XPU"]["handshake"],)
    assert KINDS["XPU"].register_annotation() == GO["keys"]["xpu_register"]
    assert whole.resources.all() == [config["ResourceCountName"]]
    assert shared.resources.all() == [config["ResourceVCountName"], config["ResourceVMemoryName"]]
    assert (KINDS["kunlun"].annotation("use-uuid"), KINDS["XPU"].annotation("use-uuid")) == (
        "baidu.com/use-gpuuuid",
        "hami.io/use-xpu-uuid",
    )


def test_metax_has_gos_keys_and_names() -> None:
    keys, config = GO["keys"]["metax"], GO["about"]["config"]["metax"]
    whole, shared = BACKENDS["Metax-GPU"], BACKENDS["Metax-SGPU"]
    assert isinstance(whole, MetaxGpuBackend) and isinstance(shared, MetaxSgpuBackend)
    for backend in (whole, shared):
        word = backend.type_word
        assert (backend.to_allocate_key, backend.allocated_key, backend.vendor_word) == (
            keys[word]["to_allocate"],
            keys[word]["allocated"],
            word,
        )
        assert (KINDS[word].annotation("use-uuid"), KINDS[word].annotation("nouse-uuid")) == (
            "metax-tech.com/use-gpuuuid",
            "metax-tech.com/nouse-gpuuuid",
        )
    assert whole.resources.all() == [config["ResourceCountName"]]
    assert shared.resources.all() == [
        config["ResourceVCountName"],
        config["ResourceVMemoryName"],
        config["ResourceVCoreName"],
    ]
    assert GO["keys"]["metax_node_devices"] == "metax-tech.com/node-gpu-devices"
    assert GO["keys"]["metax_allocated"] == "metax-tech.com/gpu-devices-allocated"


def test_binds_lock_the_node_where_gos_lock_node_does() -> None:
    """Go's ``LockNode`` takes ``hami.io/mutex.lock`` for Iluvatar, Kunlunxin ``XPU``
    and ``Metax-SGPU`` (HAMi's node lock, released by their plug-ins) and does nothing for
    Moore Threads, ``kunlun`` and ``Metax-GPU``, whose vendors' plug-ins release no lock
    (pkg/device/{mthreads,kunlun,metax}/device.go at the vectors' commit)."""
    locking = {word: KINDS[word].node_lock for word in (*ILUVATAR_CLASSES, *BACKENDS)}
    assert {word for word, takes in locking.items() if not takes} == {
        "mthreads",
        "kunlun",
        "Metax-GPU",
    }


@pytest.mark.parametrize(
    ("word", "vendor"),
    [
        ("BI-V150", "Iluvatar"),
        ("mthreads", "Moore Threads"),
        ("kunlun", "Kunlunxin"),
        ("XPU", "Kunlunxin"),
        ("Metax-GPU", "MetaX"),
        ("Metax-SGPU", "MetaX"),
    ],
)
def test_a_node_agent_cannot_serve_them(word: str, vendor: str) -> None:
    with pytest.raises(BackendError, match=f"no node side for {vendor}"):
        asyncio.run(BACKENDS[word].enumerate())


@pytest.mark.parametrize(
    "word", ["BI-V150", "mthreads", "kunlun", "XPU", "Metax-GPU", "Metax-SGPU", "Ascend910B3"]
)
def test_their_resource_names_are_the_plug_ins(word: str) -> None:
    """The request rules and pod values name what the vendor's plug-in advertises: a
    configuration that renames them is refused, naming the type and the key to remove."""
    from hami.backends.base import BackendSettings
    from hami.protocol.resources import ResourceNames

    renamed = BackendSettings(resources=ResourceNames("example.com/gpu"))
    with pytest.raises(BackendError, match=f"{word}: the resource names are Go HAMi's"):
        registry.create(word, renamed)
    # Hygon's names are configurable in Go HAMi too
    assert registry.create("dcu", renamed).resources.count == "example.com/gpu"


# ------------------------------------------------------------------ node reading


@pytest.mark.parametrize("case", _cases("nodes"))
def test_nodes_are_read_as_go_reads_them(case: dict[str, Any]) -> None:
    """Go numbers every device of the 7-field form 0; it is numbered by position here
    (protocol.md §8), so indices are compared by position."""
    backend = BACKENDS[case["vendor"]]
    try:
        found = backend.devices_from_node(case["node"]) or []
        ours = [(d.uuid, d.count, d.memory, d.cores, d.model, d.numa, d.healthy) for d in found]
        positions = [d.index for d in found] == list(range(len(found)))
        detail = f"ours {ours}"
    except ProtocolError as exc:
        ours, positions, detail = [], True, f"ours refused: {exc}"
    fields = ("id", "count", "devmem", "devcore", "type", "numa", "health")
    go = [tuple(d[f] for f in fields) for d in case["go"]["devices"]]
    agrees = ours == go and positions
    _judge("nodes", case, agrees, f"{detail}; go {go} {case['go'].get('error', '')}")


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


def _ours(case: dict[str, Any]) -> tuple[bool, Any, dict[str, int], dict[str, str]]:
    """Whether the webhook takes the container, the request (or its refusal), the device
    resources and the environment the container has after the webhook."""
    kind = KINDS[case["vendor"]]
    pod = _pod(case)
    container = pod["spec"]["containers"][0]
    taken = asks_for(container, [kind])
    annotations = pod["metadata"]["annotations"]
    try:
        found = parse_device_request(container_resources(container), kind, "c", annotations)
        ops = mutations(pod, [kind], "hami-scheduler")
    except RequestError as exc:
        return taken, f"refused: {exc}", {}, {}
    after = apply_patch(pod, ops)["spec"]["containers"][0]
    limits = (after.get("resources") or {}).get("limits") or {}
    written = {n: parse_quantity(v) for n, v in limits.items() if n in kind.resources.all()}
    env = {e["name"]: e["value"] for e in after.get("env") or []}
    if found is None:  # no request: what the webhook left asks for nothing, as on Go's side
        return taken, None, {}, env
    request = {
        "nums": found.count,
        "type": found.vendor,
        "memreq": found.memory,
        "mempercentagereq": found.memory_percentage or 0,
        "coresreq": found.cores,
    }
    return taken, request, written, env


@pytest.mark.parametrize("case", _cases("containers"))
def test_containers_are_taken_rewritten_and_asked_for_as_go_does(case: dict[str, Any]) -> None:
    """Go's webhook (MutateAdmission) then its scheduler (GenerateResourceRequests on what
    the webhook wrote, cores as its Fit takes them: at most 100 %) against this project's
    webhook and request parsing."""
    go = case["go"]
    taken, request, written, env = _ours(case)
    names = KINDS[case["vendor"]].resources.all()
    go_taken = go["mutate"] or "mutate_error" in go
    if "mutate_error" in go:
        agrees = taken and isinstance(request, str)
        detail = f"ours {request}; go refused: {go['mutate_error']}"
    else:
        after = _as_placed(case["vendor"], dict(go["request_after"]))
        after["coresreq"] = min(after["coresreq"], WHOLE)
        go_request = after if after["nums"] > 0 else None
        go_written = {}  # no request: what the webhook wrote asks for nothing
        if go_request is not None:
            go_written = {
                n: parse_quantity(v)
                for n, v in (go["mutated"].get("limits") or {}).items()
                if n in names
            }
        go_env = go.get("mutated_env") or {}
        ours = (taken, request, written, env)
        theirs = (go_taken, go_request, go_written, go_env)
        agrees = ours == theirs
        detail = f"ours {ours}; go {theirs}"
    _judge("containers", case, agrees, detail)


# ------------------------------------------------------------------ pod values


@pytest.mark.parametrize("case", _cases("pod_values"))
def test_pod_values_are_written_as_go_writes_them(case: dict[str, Any]) -> None:
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
        if kind.pod_annotations is not None:
            ours.update(
                kind.pod_annotations(
                    containers, index.__getitem__, case.get("pod_annotations") or {}
                )
            )
    go = dict(case["go"]["annotations"])
    if case["vendor"] == "mthreads":
        assert [go.pop(key) for key in NOT_WRITTEN] == ["<unix nanoseconds>", ""]
    if case["vendor"] == "Metax-SGPU":
        assert go.pop(METAX_NOT_WRITTEN) == "<unix nanoseconds>"
    if case["vendor"] in NO_TO_ALLOCATE:
        assert kind.to_allocate_key not in go
        ours.pop(kind.to_allocate_key, None)
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
            mode=d.get("qos_policy") or "hami-core",  # MetaX: the QoS policy as the mode
        )
        for d in case["devices"]
    ]


@pytest.mark.parametrize("case", _cases("fits"))
def test_requests_get_the_devices_gos_fit_gives(case: dict[str, Any]) -> None:
    """Fit or not as Go's Fit decides, and where Go fits, the devices Go gives (as a set:
    the order among equal devices is the node policy's), each with Go's memory and cores.
    The pod's uuid selectors and ``hami.io/gpu-scheduler-policy`` apply as Go reads them."""
    kind = KINDS[case["vendor"]]
    resources = container_resources(case["container"])
    go = case["go"]
    annotations = case.get("pod_annotations") or {}
    policy = annotations.get("hami.io/gpu-scheduler-policy", "spread")
    try:
        request = parse_device_request(resources, kind, "c", annotations)
    except RequestError as exc:
        assert "mutate_error" in go, f"ours refused ({exc}), Go took it"
        return
    assert "mutate_error" not in go, "Go refused the container, ours took it"
    assert request is not None
    selectors = parse_selectors(annotations, kind)
    chosen = fit_container(_states(case), request, selectors, {}, policy)
    ours = None if chosen is None else sorted((d.uuid, mib, request.cores) for d, mib in chosen)
    answers = [
        sorted((d["uuid"], d["usedmem"], d["usedcores"]) for d in a["devices"])
        if a["fits"]
        else None
        for a in go["answers"]
    ]
    _judge("fits", case, ours in answers, f"ours {ours}; go {answers}")
