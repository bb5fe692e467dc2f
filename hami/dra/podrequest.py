"""A pod's ResourceClaims as the request the fit code weighs (``PodRequest``). Pure.

The DRA-mode score (docs/dra.md "Scoring nodes in DRA mode") ranks the nodes
kube-scheduler is choosing between by the ``defrag`` policy's cost; that cost is computed
on a ``PodRequest``. This module reads what the pod's claims ask of hami's DeviceClasses
and writes it in that form, by the table of docs/dra.md "HAMi request shapes":

- each request of a hami DeviceClass (``exactly``, or the first hami subrequest of a
  ``firstAvailable`` list, kube-scheduler's first choice) is one ``DeviceRequest``:
  ``count`` devices (default 1), ``capacity.requests.memory`` in MiB (rounded up; none:
  the published default, the whole device), ``capacity.requests.cores`` (none: the
  backend's default cores);
- a CEL selector of the form ``device.attributes["<driver>"].model.contains("X")`` (the one
  ``hami.testkit.dra_pods`` writes, ``nvidia.com/use-gputype``'s DRA form) becomes a type
  selector, ``!...contains("X")`` an exclusion; any other CEL is left to kube-scheduler,
  which has already filtered the nodes it asks about;
- every claim counts as held for the pod's whole life (the kubelet keeps an init
  container's claim too), so each request is weighed as an app container of its own;
- an ``adminAccess`` request (monitoring) holds nothing and is left out.

Requests of other DeviceClasses are not hami's and are left out; a pod with no hami
request gets None (no opinion). What cannot be read raises ``RequestError`` naming the pod
and the claim; a claim the caller does not know (yet) raises ``UnknownClaim``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.core.requests import (
    DeviceKind,
    DeviceRequest,
    PodRequest,
    RequestError,
    Selectors,
    parse_quantity,
)
from hami.dra.names import not_a_partition

MIB = 1 << 20
MAX_CORES = 100

# (namespace, name) -> the object as the API server has it, or None when not known
Lookup = Callable[[str, str], Mapping[str, Any] | None]

# ``.lowerAscii()`` before ``contains``: the form hami's webhook writes for use-gputype
_MODEL_CONTAINS = re.compile(
    r'^\s*(!\s*)?device\.attributes\["(?P<driver>[^"]+)"\]\.model(?:\.lowerAscii\(\))?'
    r'\.contains\("(?P<model>[^"\\]*)"\)\s*$'
)


class UnknownClaim(RequestError):
    """A claim (or template) the pod names is not in the caller's picture yet."""


@dataclass(frozen=True, slots=True)
class _Asked:
    request: DeviceRequest
    use_types: tuple[str, ...]
    nouse_types: tuple[str, ...]


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RequestError(f"{what} is not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError(f"{what} is not a list")
    return value


def _count(body: Mapping[str, Any], where: str) -> int:
    mode = body.get("allocationMode") or "ExactCount"
    if mode == "All":
        raise RequestError(
            f"{where}: allocationMode All (every matching device of the node) is not weighed"
        )
    if mode != "ExactCount":
        raise RequestError(f"{where}: allocationMode {mode!r} is not ExactCount or All")
    count = body.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise RequestError(f"{where}: count {count!r} is not a whole number >= 1")
    return count


def _memory_mib(value: Any, where: str) -> int:
    try:
        amount = parse_quantity(value)
    except (ValueError, ArithmeticError, TypeError):
        raise RequestError(f"{where}: memory {value!r} is not a quantity") from None
    if amount <= 0:
        raise RequestError(f"{where}: memory {value!r} is not above 0")
    return -(-amount // MIB)


def _cores(value: Any, where: str) -> int:
    try:
        cores = parse_quantity(value)
    except (ValueError, ArithmeticError, TypeError):
        raise RequestError(f"{where}: cores {value!r} is not a number") from None
    if not 0 <= cores <= MAX_CORES:
        raise RequestError(f"{where}: cores {value!r} is not within 0..{MAX_CORES}")
    return cores


def _models(body: Mapping[str, Any], driver: str, where: str) -> tuple[list[str], list[str]]:
    use: list[str] = []
    nouse: list[str] = []
    for i, selector in enumerate(_list(body.get("selectors"), f"{where}: selectors")):
        cel = _mapping(_mapping(selector, f"{where}: selector {i}").get("cel"), f"{where}: cel")
        match = _MODEL_CONTAINS.match(str(cel.get("expression") or ""))
        if match is None or match.group("driver") != driver:
            continue  # kube-scheduler evaluates it; the nodes it asks about passed it
        (nouse if match.group(1) else use).append(match.group("model").lower())
    return use, nouse


def reads_selector(expression: str, driver: str) -> bool:
    """Whether ``expression`` is a model selector this module reads, or the webhook's
    exclusion of MIG partitions (which hami's reading leaves out anyway); the rest of CEL
    is kube-scheduler's alone."""
    if expression == not_a_partition(driver):
        return True
    match = _MODEL_CONTAINS.match(expression)
    return match is not None and match.group("driver") == driver


def device_request(body: Mapping[str, Any], kind: DeviceKind, driver: str, where: str) -> _Asked:
    """One ``exactly`` request (or subrequest) of a hami DeviceClass."""
    count = _count(body, where)
    capacity = _mapping(body.get("capacity"), f"{where}: capacity")
    wanted = _mapping(capacity.get("requests"), f"{where}: capacity.requests")
    if "memory" in wanted:
        memory, percentage = _memory_mib(wanted["memory"], where), None
    else:
        memory, percentage = 0, 100  # the published default: the whole device
    cores = _cores(wanted["cores"], where) if "cores" in wanted else kind.default_cores
    use, nouse = _models(body, driver, where)
    request = DeviceRequest(
        type_word=kind.type_word,
        vendor=kind.vendor_word,
        count=count,
        memory=memory,
        memory_percentage=percentage,
        cores=cores,
    )
    return _Asked(request, tuple(use), tuple(nouse))


@dataclass(frozen=True, slots=True)
class Choice:
    """One way to meet a claim request: the request itself (``exactly``) or one
    subrequest of its ``firstAvailable`` list, of a hami DeviceClass."""

    subrequest: str  # "" for ``exactly``
    driver: str  # the DeviceClass name, which is hami's driver name
    asked: _Asked
    body: Mapping[str, Any]  # as written: selectors, tolerations, capacity


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One entry of a claim's ``spec.devices.requests``."""

    name: str
    where: str  # "ResourceClaim ns/x request 'gpu'", for messages
    choices: tuple[Choice, ...]  # hami's, in order; () when none is hami's
    admin: bool = False  # adminAccess: holds nothing, not weighed


def request_choices(
    spec: Mapping[str, Any],
    classes: Mapping[str, DeviceKind],
    where: str,
    *,
    every: bool = False,
) -> list[ClaimRequest]:
    """The requests of one claim spec (``ResourceClaim.spec``) with their hami choices:
    only the first (kube-scheduler's first choice among hami's) unless ``every``."""
    devices = _mapping(_mapping(spec, f"{where}: spec").get("devices"), f"{where}: spec.devices")
    out: list[ClaimRequest] = []
    for i, item in enumerate(_list(devices.get("requests"), f"{where}: spec.devices.requests")):
        entry = _mapping(item, f"{where}: request {i}")
        name = str(entry.get("name", i))
        at = f"{where} request {name!r}"
        if entry.get("exactly") is not None:
            bodies = [("", _mapping(entry["exactly"], f"{at}: exactly"))]
            if bodies[0][1].get("adminAccess") is True:
                # monitoring access holds nothing: kube-scheduler does not count it
                out.append(ClaimRequest(name, at, (), admin=True))
                continue
        else:
            listed = _list(entry.get("firstAvailable"), f"{at}: firstAvailable")
            subs = [_mapping(raw, f"{at}: firstAvailable {j}") for j, raw in enumerate(listed)]
            bodies = [(str(sub.get("name", j)), sub) for j, sub in enumerate(subs)]
        choices: list[Choice] = []
        for sub_name, body in bodies:
            driver = str(body.get("deviceClassName") or "")
            kind = classes.get(driver)
            if kind is None:
                continue
            sub = f"{at} subrequest {body['name']!r}" if "name" in body else at
            choices.append(Choice(sub_name, driver, device_request(body, kind, driver, sub), body))
            if not every:
                break
        out.append(ClaimRequest(name, at, tuple(choices)))
    return out


def claim_requests(
    spec: Mapping[str, Any], classes: Mapping[str, DeviceKind], where: str
) -> list[_Asked]:
    """The hami requests of one claim spec (``ResourceClaim.spec``): each request's first
    hami choice."""
    return [r.choices[0].asked for r in request_choices(spec, classes, where) if r.choices]


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One entry of a pod's ``spec.resourceClaims``, resolved."""

    name: str  # the pod's name for it (what containers' ``resources.claims`` name)
    where: str  # "ResourceClaim ns/x" or, before the claim exists, "ResourceClaimTemplate ns/t"
    spec: Mapping[str, Any]  # the claim's spec
    claim: Mapping[str, Any] | None  # the ResourceClaim, None while only the template exists


def resolve_claim(
    pod: Mapping[str, Any], ref: Mapping[str, Any], claims: Lookup, templates: Lookup
) -> PodClaim:
    """The claim (or, before the resourceclaim controller made it, the template) a pod's
    ``spec.resourceClaims`` entry names. Raises UnknownClaim for one not known (yet)."""
    meta = _mapping(pod.get("metadata"), "pod metadata")
    namespace = str(meta.get("namespace") or "default")
    name = str(ref.get("name") or "")
    statuses = _list(
        _mapping(pod.get("status"), "pod status").get("resourceClaimStatuses"),
        "status.resourceClaimStatuses",
    )
    if ref.get("resourceClaimName"):
        claim_name = str(ref["resourceClaimName"])
        claim = claims(namespace, claim_name)
        if claim is None:
            raise UnknownClaim(f"ResourceClaim {namespace}/{claim_name} is not known yet")
        where = f"ResourceClaim {namespace}/{claim_name}"
        return PodClaim(name, where, _mapping(claim.get("spec"), f"{where}: spec"), claim)
    template_name = ref.get("resourceClaimTemplateName")
    if not template_name:
        raise RequestError(
            f"spec.resourceClaims {name!r} names neither resourceClaimName nor "
            "resourceClaimTemplateName"
        )
    for status in statuses:
        if isinstance(status, Mapping) and status.get("name") == name:
            made = status.get("resourceClaimName")
            claim = claims(namespace, str(made)) if made else None
            if claim is not None:
                where = f"ResourceClaim {namespace}/{made}"
                return PodClaim(name, where, _mapping(claim.get("spec"), f"{where}: spec"), claim)
    template = templates(namespace, str(template_name))
    if template is None:
        raise UnknownClaim(f"ResourceClaimTemplate {namespace}/{template_name} is not known yet")
    where = f"ResourceClaimTemplate {namespace}/{template_name}"
    body = _mapping(template.get("spec"), f"{where}: spec")
    return PodClaim(name, where, _mapping(body.get("spec"), f"{where}: spec.spec"), None)


def pod_name(pod: Mapping[str, Any]) -> str:
    """``pod ns/name`` of a pod that may be malformed, for messages."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    return f"pod {meta.get('namespace', '?')}/{meta.get('name', '?')}"


def pod_claims(pod: Mapping[str, Any], claims: Lookup, templates: Lookup) -> list[PodClaim]:
    """Every claim the pod names, resolved; RequestError (UnknownClaim) names the pod."""
    try:
        spec = _mapping(pod.get("spec"), "spec")
        return [
            resolve_claim(pod, _mapping(ref, f"spec.resourceClaims {i}"), claims, templates)
            for i, ref in enumerate(_list(spec.get("resourceClaims"), "spec.resourceClaims"))
        ]
    except UnknownClaim as exc:
        raise UnknownClaim(f"{pod_name(pod)}: {exc}") from None
    except RequestError as exc:
        raise RequestError(f"{pod_name(pod)}: {exc}") from None


def pod_request(
    pod: Mapping[str, Any],
    classes: Mapping[str, DeviceKind],
    claims: Lookup,
    templates: Lookup,
) -> PodRequest | None:
    """What ``pod``'s claims ask of hami's DeviceClasses (``classes``: DeviceClass name,
    the driver name, -> its kind); None when nothing. Raises RequestError (UnknownClaim
    for a claim or template not known yet) naming the pod and the object."""
    asked: list[_Asked] = []
    for claim in pod_claims(pod, claims, templates):
        try:
            asked.extend(claim_requests(claim.spec, classes, claim.where))
        except RequestError as exc:
            raise RequestError(f"{pod_name(pod)}: {exc}") from None
    if not asked:
        return None
    return PodRequest(
        containers=tuple((a.request,) for a in asked),
        init_count=0,
        selectors=_selectors(asked),
    )


def _selectors(asked: Sequence[_Asked]) -> dict[str, Selectors]:
    """Per type, the model words any of its requests name (the loosest reading: a node
    is ranked as if each request could use any of them)."""
    out: dict[str, Selectors] = {}
    for word in dict.fromkeys(a.request.type_word for a in asked):
        mine = [a for a in asked if a.request.type_word == word]
        use = tuple(dict.fromkeys(t for a in mine for t in a.use_types))
        # a model is excluded only when every request excludes it
        nouse = tuple(
            t
            for t in dict.fromkeys(t for a in mine for t in a.nouse_types)
            if all(t in a.nouse_types for a in mine)
        )
        if use and all(a.use_types for a in mine):
            out[word] = Selectors(use_types=use, nouse_types=nouse)
        elif nouse:
            out[word] = Selectors(nouse_types=nouse)
    return out
