"""A pod written for the extender mode, turned into the DRA mode's claim at admission. Pure.

docs/dra.md "Unchanged HAMi pods". The webhook calls this for a device pod whose namespace
runs in the DRA mode (``devicemode``). What the pod asks is read by the extender path's own
parser (``parse_pod``, with the count and cores the extender webhook fills in,
``webhook.defaults``), and written as

- one ResourceClaimTemplate whose claim has one request per container and device type
  (named after the container, ``{container}-{type}`` when the pod asks for several types):
  ``count`` devices of the type's DeviceClass (``{type}.hami.io``), distinct ones
  (``distinctAttribute: {driver}/uuid``, as HAMi never gives a container one device twice),
  ``capacity.requests`` ``memory: {MiB}Mi`` and ``cores``; a memory percentage below 100
  as a ``firstAvailable`` list with one subrequest per device size the driver's
  ResourceSlices publish (capacity requests are amounts); 100 % as no memory (the
  published default is the whole device); ``use-/nouse-gputype`` and ``use-/nouse-gpuuuid``
  as CEL selectors, ``numa-bind`` as ``matchAttribute: {driver}/numa``, and on every
  request CEL that keeps it off MIG partitions (``names.not_a_partition``);
- JSON patch operations for the pod: ``spec.resourceClaims`` gets ``hami`` from that
  template, each container's ``resources.claims`` its requests, the HAMi resources leave
  its limits and requests, and ``CUDA_TASK_PRIORITY`` is written as the extender webhook
  writes it (the claim has no field for it).

The template's name is a hash of its spec, so pods of one shape (a Deployment's) share one
template and a repeated admission names the same one: the pod names it before it exists
(a mutating webhook cannot know the pod's uid), and the resourceclaim controller makes the
pod's claim from it, owned by the pod.

What the DRA mode cannot express is refused (``Unsupported``) with the pod, container and
the fix, never dropped.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.backends.hamicore import TASK_PRIORITY_ENV
from hami.core.requests import (
    DEVICE_SCORING_WEIGHTS,
    DeviceKind,
    DeviceRequest,
    PodRequest,
    RequestError,
    Selectors,
    container_resources,
    parse_device_request,
    parse_pod,
)
from hami.dra.names import driver_name, not_a_partition
from hami.protocol import keys
from hami.protocol.objects import annotations_of, pod_containers
from hami.scheduler.webhook import (
    check_placement,
    defaults,
    escape,
    forged_keys,
    pod_ref,
    runtime_class_ops,
    strip_ops,
    task_priority,
)

POD_CLAIM = "hami"  # the pod's spec.resourceClaims[].name
TEMPLATE_PREFIX = "hami-"
GENERATED_LABEL = "hami.io/generated-by"
MAX_SUBREQUESTS = 8  # resource.k8s.io/v1: firstAvailable holds at most 8
MAX_NAME = 63  # a request name is a DNS label
DRA_DEVICE_MODE = "hami-core"  # the only device mode a DRA driver publishes
# Selector values go into CEL string literals: only characters model names and uuids use.
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9 ._:+/-]{1,128}$")


class Unsupported(RequestError):
    """A request the DRA mode cannot express; the message names the pod, container and fix."""


@dataclass(frozen=True)
class Conversion:
    """The template to create (before the pod) and the pod's patch."""

    template: dict[str, Any]
    ops: list[dict[str, Any]]
    warnings: tuple[str, ...] = ()

    @property
    def template_name(self) -> str:
        return str(self.template["metadata"]["name"])


def supported(kind: DeviceKind) -> bool:
    """Whether a kind's requests have a DRA form: the generic rules only (a vendor's own
    request rules, per-container cores or memory, or a memory unit reader have none)."""
    return not (
        kind.request_rule is not None
        or kind.cores_per_container
        or kind.memory_per_container
        or kind.memory_reader is not None
    )


def _where(pod: Mapping[str, Any], container: Mapping[str, Any], position: int, init: int) -> str:
    word = "init container" if position < init else "container"
    return f"pod {pod_ref(pod)} {word} {container.get('name', position)!r}"


def container_requests(
    pod: Mapping[str, Any], kinds: Sequence[DeviceKind]
) -> list[list[DeviceRequest]]:
    """Each container's requests (init containers first), with the count and cores the
    extender webhook fills in (a count-only container asks the whole device), read by the
    extender's parser. Raises RequestError (and Unsupported) naming the pod and container."""
    annotations = annotations_of(pod)
    containers, init = pod_containers(pod)
    out: list[list[DeviceRequest]] = []
    for position, container in enumerate(containers):
        where = _where(pod, container, position, init)
        resources = dict(container_resources(container))
        found: list[DeviceRequest] = []
        for kind in kinds:
            if not any(name in resources for name in kind.resources.all()):
                continue
            if not supported(kind):
                raise Unsupported(
                    f"{where} asks for {kind.type_word} devices, whose request rules have no "
                    "DRA form; run the pod in a namespace in the extender mode (label "
                    "hami.io/device-mode=extender)"
                )
            filled = {**resources, **defaults(resources, kind, annotations)}
            request = parse_device_request(filled, kind, where, annotations)
            if request is not None:
                found.append(request)
        out.append(found)
    return out


def percent_types(pod: Mapping[str, Any], kinds: Sequence[DeviceKind]) -> set[str]:
    """The types some container asks a memory percentage below 100 of: their device sizes
    must be read (from the ResourceSlices) before ``convert``."""
    return {
        r.type_word
        for requests in container_requests(pod, kinds)
        for r in requests
        if r.memory_percentage is not None and r.memory_percentage < 100
    }


def _safe(value: str, what: str, pod: Mapping[str, Any], key: str) -> str:
    if not _SAFE_VALUE.match(value):
        raise RequestError(
            f"pod {pod_ref(pod)}: annotation {key}: {what} {value[:64]!r} has characters no "
            "model name or uuid has; use letters, digits, space and . _ : + / -"
        )
    return value


def _quoted(values: Sequence[str]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def selector_expressions(
    selectors: Selectors, kind: DeviceKind, pod: Mapping[str, Any]
) -> list[str]:
    """CEL for a type's selector annotations: the model contains (case-insensitively, as
    the extender compares) one of the use types and none of the nouse ones; the uuid is
    one of the used and none of the refused."""
    driver = driver_name(kind.type_word)
    attrs = f'device.attributes["{driver}"]'
    model = f"{attrs}.model.lowerAscii()"
    out: list[str] = []
    uses = [_safe(t, "type", pod, kind.annotation("use-type")) for t in selectors.use_types]
    if len(uses) == 1:
        out.append(f'{model}.contains("{uses[0]}")')
    elif uses:
        out.append(" || ".join(f'{model}.contains("{t}")' for t in uses))
    for t in selectors.nouse_types:
        nouse = _safe(t, "type", pod, kind.annotation("nouse-type"))
        out.append(f'!{model}.contains("{nouse}")')
    if selectors.use_uuids:
        used = sorted(
            _safe(u, "uuid", pod, kind.annotation("use-uuid")) for u in selectors.use_uuids
        )
        out.append(f"{attrs}.uuid in [{_quoted(used)}]")
    if selectors.nouse_uuids:
        key = kind.annotation("nouse-uuid")
        refused = sorted(_safe(u, "uuid", pod, key) for u in selectors.nouse_uuids)
        out.append(f"!({attrs}.uuid in [{_quoted(refused)}])")
    return out


def _size_expression(driver: str, mib: int) -> str:
    return f'device.capacity["{driver}"].memory.compareTo(quantity("{mib}Mi")) == 0'


def _exact(
    request: DeviceRequest,
    kind: DeviceKind,
    cel: Sequence[str],
    memory_mib: int | None,
) -> dict[str, Any]:
    driver = driver_name(kind.type_word)
    body: dict[str, Any] = {"deviceClassName": driver}
    if request.count != 1:
        body["allocationMode"] = "ExactCount"
        body["count"] = request.count
    capacity: dict[str, str] = {}
    if memory_mib is not None:
        capacity["memory"] = f"{memory_mib}Mi"
    capacity["cores"] = str(request.cores)
    body["capacity"] = {"requests": capacity}
    if cel:
        body["selectors"] = [{"cel": {"expression": e}} for e in cel]
    return body


def device_request(
    name: str,
    request: DeviceRequest,
    kind: DeviceKind,
    cel: Sequence[str],
    sizes: Sequence[int],
    where: str,
) -> dict[str, Any]:
    """One claim request for one container's request of one type."""
    percent = request.memory_percentage
    if percent is None:
        return {"name": name, "exactly": _exact(request, kind, cel, request.memory)}
    if percent >= 100:
        return {"name": name, "exactly": _exact(request, kind, cel, None)}
    driver = driver_name(kind.type_word)
    distinct = sorted(set(sizes))
    if not distinct:
        raise Unsupported(
            f"{where}: {kind.resources.memory_percentage}: {percent} has no DRA form until a "
            f"node publishes {driver} devices (a claim asks amounts, and no device size is "
            f"known); ask {kind.resources.memory} in MiB instead, or retry once a node is up"
        )
    if len(distinct) > MAX_SUBREQUESTS:
        raise Unsupported(
            f"{where}: {kind.resources.memory_percentage}: {percent} would need one "
            f"alternative per device size ({len(distinct)} sizes, at most {MAX_SUBREQUESTS} "
            f"fit a claim); ask {kind.resources.memory} in MiB instead"
        )
    subrequests = []
    for index, mib in enumerate(distinct):
        share = max(1, mib * percent // 100)
        body = _exact(request, kind, [*cel, _size_expression(driver, mib)], share)
        subrequests.append({"name": f"m{index}", **body})
    return {"name": name, "firstAvailable": subrequests}


def _request_name(container: str, kind: DeviceKind, several: bool, where: str) -> str:
    name = f"{container}-{kind.type_word.lower()}" if several else container
    if len(name) > MAX_NAME:
        raise Unsupported(
            f"{where}: the claim request {name!r} is longer than {MAX_NAME} characters; "
            "shorten the container's name"
        )
    return name


def _constraints(
    name: str, request: DeviceRequest, kind: DeviceKind, selectors: Selectors
) -> list[dict[str, Any]]:
    if request.count < 2:
        return []
    driver = driver_name(kind.type_word)
    out: list[dict[str, Any]] = [{"requests": [name], "distinctAttribute": f"{driver}/uuid"}]
    if selectors.numa_bind:
        out.append({"requests": [name], "matchAttribute": f"{driver}/numa"})
    return out


def template_name(spec: Mapping[str, Any]) -> str:
    """``hami-`` and a hash of the claim spec: the same shape, the same template."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return f"{TEMPLATE_PREFIX}{digest[:16]}"


def _check_pod(pod: Mapping[str, Any], request: PodRequest, kinds: Sequence[DeviceKind]) -> None:
    spec = pod.get("spec") or {}
    claims = spec.get("resourceClaims") or []
    if not isinstance(claims, list):
        raise RequestError(f"pod {pod_ref(pod)}: spec.resourceClaims is not a list")
    if any(isinstance(c, Mapping) and c.get("name") == POD_CLAIM for c in claims):
        raise Unsupported(
            f"pod {pod_ref(pod)} already names a resource claim {POD_CLAIM!r}, the name hami "
            "gives the claim of its devices; rename that claim"
        )
    for kind in kinds:
        selectors = request.selectors.get(kind.type_word)
        mode = selectors.vgpu_mode if selectors else None
        if mode is not None and DRA_DEVICE_MODE not in mode:
            raise Unsupported(
                f"pod {pod_ref(pod)}: annotation {kind.domain}/vgpu-mode {mode!r} asks for a "
                f"device mode the DRA mode has none of (its devices are {DRA_DEVICE_MODE}); "
                "remove the annotation or run the pod in an extender-mode namespace"
            )


def _ignored_warnings(pod: Mapping[str, Any]) -> tuple[str, ...]:
    annotations = annotations_of(pod)
    ignored = [
        key
        for key in (
            keys.NODE_SCHEDULER_POLICY,
            keys.DEVICE_SCHEDULER_POLICY,
            DEVICE_SCORING_WEIGHTS,
        )
        if key in annotations
    ]
    if not ignored:
        return ()
    return (
        f"pod {pod_ref(pod)}: {', '.join(ignored)} not applied in the DRA mode "
        "(kube-scheduler places the claim with its own scoring)",
    )


def convert(
    pod: Mapping[str, Any],
    kinds: Sequence[DeviceKind],
    scheduler_name: str,
    runtime_class: str = "",
    sizes: Mapping[str, Sequence[int]] | None = None,
) -> Conversion | None:
    """The template and pod patch for a device pod hami schedules (the caller checked
    ``webhook.for_hami``); ``sizes`` are the device sizes (MiB) each type's slices publish,
    needed only for ``percent_types``; None when the pod asks no device after all (a count
    of 0, only a priority), which the extender path answers. Raises RequestError,
    Unsupported or PodDenied."""
    check_placement(pod, kinds)
    parsed = parse_pod(pod, kinds)  # the extender's checks, and the selectors
    if parsed is None:
        return None  # a count of 0 or only a priority: no device, nothing to claim
    _check_pod(pod, parsed, kinds)
    by_type = {kind.type_word: kind for kind in kinds}
    per_container = container_requests(pod, kinds)
    several = len({r.type_word for rs in per_container for r in rs}) > 1
    containers, init = pod_containers(pod)
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    ops = strip_ops(forged_keys(pod, kinds))
    for position, (container, asked) in enumerate(zip(containers, per_container, strict=True)):
        where = _where(pod, container, position, init)
        base = (
            f"/spec/initContainers/{position}"
            if position < init
            else f"/spec/containers/{position - init}"
        )
        names: list[str] = []
        for request in asked:
            kind = by_type[request.type_word]
            selectors = parsed.selectors.get(kind.type_word) or Selectors()
            # a HAMi-core share, never a MIG partition (kube-scheduler would give a
            # 3000 MiB request a whole instance, with no limit inside it)
            cel = [
                *selector_expressions(selectors, kind, pod),
                not_a_partition(driver_name(kind.type_word)),
            ]
            name = _request_name(str(container.get("name") or position), kind, several, where)
            sizes_of = (sizes or {}).get(kind.type_word, ())
            requests.append(device_request(name, request, kind, cel, sizes_of, where))
            constraints += _constraints(name, request, kind, selectors)
            names.append(name)
        ops += _container_ops(container, base, kinds, names)
    spec: dict[str, Any] = {"devices": {"requests": requests}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    name = template_name(spec)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "labels": {GENERATED_LABEL: "webhook"}},
        "spec": {"spec": spec},
    }
    ops += _pod_ops(pod, scheduler_name, name)
    ops += runtime_class_ops(pod, kinds, runtime_class)
    return Conversion(template, ops, _ignored_warnings(pod))


def _pod_ops(pod: Mapping[str, Any], scheduler_name: str, template: str) -> list[dict[str, Any]]:
    spec = pod.get("spec") or {}
    entry = {"name": POD_CLAIM, "resourceClaimTemplateName": template}
    ops: list[dict[str, Any]] = []
    if spec.get("resourceClaims"):
        ops.append({"op": "add", "path": "/spec/resourceClaims/-", "value": entry})
    else:
        ops.append({"op": "add", "path": "/spec/resourceClaims", "value": [entry]})
    if spec.get("schedulerName") != scheduler_name:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    return ops


def _container_ops(
    container: Mapping[str, Any],
    base: str,
    kinds: Sequence[DeviceKind],
    requests: Sequence[str],
) -> list[dict[str, Any]]:
    """Remove the HAMi resources, name the container's claim requests, keep the priority."""
    resources = container.get("resources") or {}
    ops: list[dict[str, Any]] = []
    managed = {name for kind in kinds for name in kind.managed_resources()}
    for section in ("limits", "requests"):
        for name in sorted(set(resources.get(section) or {}) & managed):
            ops.append({"op": "remove", "path": f"{base}/resources/{section}/{escape(name)}"})
    env = []
    for kind in kinds:
        priority = task_priority(container, kind)
        if priority is not None:
            env.append({"name": TASK_PRIORITY_ENV, "value": priority})
    if env and container.get("env"):
        ops += [{"op": "add", "path": f"{base}/env/-", "value": item} for item in env]
    elif env:
        ops.append({"op": "add", "path": f"{base}/env", "value": env})
    if not requests:
        return ops
    claims = [{"name": POD_CLAIM, "request": name} for name in requests]
    if not resources:
        ops.append({"op": "add", "path": f"{base}/resources", "value": {"claims": claims}})
    elif resources.get("claims"):
        ops += [{"op": "add", "path": f"{base}/resources/claims/-", "value": c} for c in claims]
    else:
        ops.append({"op": "add", "path": f"{base}/resources/claims", "value": claims})
    return ops
