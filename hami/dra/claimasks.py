"""What a pod's claims ask of hami's devices, request by request, for ``hami explain``
in DRA mode. Pure.

``hami.dra.podrequest`` reads the claims (the DRA score's reader); this module keeps what
an explanation names and what the score does not need: the claim and request names,
every ``firstAvailable`` alternative, tolerations, ``distinctAttribute`` constraints, the
CEL it cannot read, and the claims already allocated (which pin the pod to their node).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.requests import DeviceKind, RequestError
from hami.dra import names, podrequest
from hami.protocol.resources import ResourceNames

_SUFFIX = "." + names.DRIVER_DOMAIN
# a claim for one MIG partition profile (docs/dra.md "MIG GPUs: partitionable devices")
# (``has(...) &&`` first, as a claim beside shared devices needs: docs/dra.md)
_ATTRIBUTE = r'device\.attributes\["(?P<DRIVER>[^"]+)"\]\.' + names.MIG_PROFILE
_PROFILE_IS = re.compile(
    r"^\s*(?:has\("
    + _ATTRIBUTE.replace("DRIVER", "has")
    + r"\)\s*&&\s*)?"
    + _ATTRIBUTE.replace("DRIVER", "driver")
    + r'\s*==\s*"(?P<profile>[^"]+)"\s*$'
)


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str  # Exists or Equal
    value: str
    effect: str  # "" tolerates every effect


@dataclass(frozen=True, slots=True)
class Want:
    """One way to meet one request: the request (``exactly``) or one subrequest."""

    label: str  # "claim x request 'gpu'" (+ " subrequest 'm0'")
    driver: str
    count: int
    memory: int | None  # MiB; None: the device's default (the whole device)
    cores: int | None  # None: the device's default
    use_models: tuple[str, ...]  # lower-case words the model must contain (any)
    nouse_models: tuple[str, ...]
    tolerations: tuple[Toleration, ...]
    distinct: bool  # distinctAttribute: each of ``count`` on a different device
    mig_profile: str | None = None  # a CEL selector asks this MIG partition profile


@dataclass(frozen=True, slots=True)
class Wanted:
    """One request of one claim: met when any of its choices is."""

    label: str
    choices: tuple[Want, ...]


@dataclass(frozen=True, slots=True)
class Pinned:
    """A claim of the pod already allocated: the pod can only go to its node."""

    claim: str
    node: str
    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PodAsks:
    wanted: tuple[Wanted, ...]
    pinned: tuple[Pinned, ...]
    own_claims: tuple[str, ...]  # ns/name of the pod's claims that exist
    notes: tuple[str, ...]  # what hami does not judge (CEL, constraints, other classes)
    errors: tuple[str, ...]  # claims that cannot be read, each naming the object


def kind_of(driver: str) -> DeviceKind:
    """A DeviceKind standing for a hami driver: only its words are read here (defaults
    come from the published slice, not from a backend)."""
    word = driver.removesuffix(_SUFFIX)
    return DeviceKind(
        type_word=word,
        vendor_word=word,
        resources=ResourceNames(count=f"{driver}/device"),
        allocated_key="",
        to_allocate_key="",
    )


def hami_classes(class_names: Iterable[str]) -> dict[str, DeviceKind]:
    """The DeviceClass names that are hami drivers (``{type}.hami.io``), with kinds."""
    return {n: kind_of(n) for n in class_names if n.endswith(_SUFFIX) and n != _SUFFIX[1:]}


def class_names(spec: Any) -> set[str]:
    """Every deviceClassName a claim spec names (for ``hami_classes``); a malformed spec
    names none (its reading fails later, with the reason)."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    out: set[str] = set()
    for entry in requests if isinstance(requests, list) else []:
        if not isinstance(entry, Mapping):
            continue
        bodies = [entry.get("exactly")]
        listed = entry.get("firstAvailable")
        bodies.extend(listed if isinstance(listed, list) else [])
        for body in bodies:
            if isinstance(body, Mapping) and isinstance(body.get("deviceClassName"), str):
                out.add(body["deviceClassName"])
    return out


def _tolerations(body: Mapping[str, Any], where: str) -> tuple[Toleration, ...]:
    raw = body.get("tolerations")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RequestError(f"{where}: tolerations is not a list")
    out: list[Toleration] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise RequestError(f"{where}: toleration {i} is not an object")
        out.append(
            Toleration(
                key=str(entry.get("key") or ""),
                operator=str(entry.get("operator") or "Equal"),
                value=str(entry.get("value") or ""),
                effect=str(entry.get("effect") or ""),
            )
        )
    return tuple(out)


def _distinct(spec: Mapping[str, Any]) -> tuple[set[str], list[str]]:
    """Request names under a distinctAttribute constraint ("*": all of the claim's), and
    notes for the constraints hami does not judge (matchAttribute)."""
    devices = spec.get("devices")
    constraints = devices.get("constraints") if isinstance(devices, Mapping) else None
    distinct: set[str] = set()
    notes: list[str] = []
    for constraint in constraints if isinstance(constraints, list) else []:
        if not isinstance(constraint, Mapping):
            continue
        requests = constraint.get("requests")
        named = [str(r) for r in requests] if isinstance(requests, list) and requests else ["*"]
        if constraint.get("distinctAttribute"):
            distinct.update(named)
        elif constraint.get("matchAttribute"):
            notes.append(
                f"matchAttribute {constraint['matchAttribute']} over {', '.join(named)} "
                "is not judged by hami"
            )
    return distinct, notes


def _want(
    label: str, choice: podrequest.Choice, request: str, distinct: set[str]
) -> tuple[Want, list[str]]:
    asked = choice.asked.request
    capacity = choice.body.get("capacity")
    wanted = capacity.get("requests") if isinstance(capacity, Mapping) else None
    named_cores = isinstance(wanted, Mapping) and "cores" in wanted
    notes = [
        f"{label}: selector {expression!r} is not judged by hami"
        for expression in _expressions(choice.body)
        if not podrequest.reads_selector(expression, choice.driver)
        and profile_asked(expression, choice.driver) is None
    ]
    profiles = [
        p for e in _expressions(choice.body) if (p := profile_asked(e, choice.driver)) is not None
    ]
    path = f"{request}/{choice.subrequest}" if choice.subrequest else request
    want = Want(
        label=label,
        driver=choice.driver,
        count=asked.count,
        memory=asked.memory if asked.memory_percentage is None else None,
        cores=asked.cores if named_cores else None,
        use_models=choice.asked.use_types,
        nouse_models=choice.asked.nouse_types,
        tolerations=_tolerations(choice.body, label),
        distinct=bool({"*", request, path} & distinct),
        mig_profile=profiles[0] if profiles else None,
    )
    return want, notes


def profile_asked(expression: str, driver: str) -> str | None:
    """The MIG profile a ``migProfile == "..."`` selector of ``driver`` asks, else None."""
    match = _PROFILE_IS.match(expression)
    if match is None or match.group("driver") != driver:
        return None
    if match.group("has") not in (None, driver):
        return None
    return match.group("profile")


def _expressions(body: Mapping[str, Any]) -> list[str]:
    selectors = body.get("selectors")
    out: list[str] = []
    for selector in selectors if isinstance(selectors, list) else []:
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        if isinstance(cel, Mapping) and cel.get("expression"):
            out.append(str(cel["expression"]))
    return out


def _pinned(claim: Mapping[str, Any], label: str, drivers: Iterable[str]) -> Pinned | None:
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not isinstance(allocation, Mapping):
        return None
    devices = allocation.get("devices")
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list) or not results:
        return None
    mine = set(drivers)
    ours = [r for r in results if isinstance(r, Mapping) and r.get("driver") in mine]
    if not ours:
        return None
    # kube-scheduler names the node in the allocation's nodeSelector; hami's pool is the
    # node's name too (the fallback), and one claim's devices are all on one node
    node = _selected_node(allocation.get("nodeSelector")) or str(ours[0].get("pool") or "")
    devices = tuple(str(r.get("device")) for r in ours)
    return Pinned(label, node, devices) if node else None


def _selected_node(selector: Any) -> str:
    """The node an allocation's ``nodeSelector`` names by ``metadata.name`` ("" if none)."""
    terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
    for term in terms if isinstance(terms, list) else []:
        fields = term.get("matchFields") if isinstance(term, Mapping) else None
        for match in fields if isinstance(fields, list) else []:
            if not isinstance(match, Mapping) or match.get("key") != "metadata.name":
                continue
            values = match.get("values")
            if match.get("operator") == "In" and isinstance(values, list) and len(values) == 1:
                return str(values[0])
    return ""


def pod_asks(
    pod: Mapping[str, Any],
    claims: podrequest.Lookup,
    templates: podrequest.Lookup,
) -> PodAsks:
    """What ``pod``'s claims ask of hami's devices. Raises RequestError (UnknownClaim for
    a claim or template that does not exist) naming the pod and the object; a claim whose
    requests cannot be read is an error of its own, the others are still read."""
    resolved = podrequest.pod_claims(pod, claims, templates)
    wanted: list[Wanted] = []
    pinned: list[Pinned] = []
    own: list[str] = []
    notes: list[str] = []
    errors: list[str] = []
    for claim in resolved:
        if claim.claim is not None:
            meta = claim.claim.get("metadata")
            meta = meta if isinstance(meta, Mapping) else {}
            name = str(meta.get("name") or claim.name)
            own.append(f"{meta.get('namespace') or '?'}/{name}")
            label = f"claim {name}"
        else:
            label = f"claim {claim.name} (not made yet, from {claim.where})"
        classes = hami_classes(class_names(claim.spec))
        if not classes:
            continue
        if claim.claim is not None and (found := _pinned(claim.claim, label, classes)):
            pinned.append(found)
            continue
        try:
            requests = podrequest.request_choices(claim.spec, classes, claim.where, every=True)
        except RequestError as exc:
            errors.append(f"{podrequest.pod_name(pod)}: {exc}")
            continue
        distinct, constraint_notes = _distinct(claim.spec)
        notes.extend(f"{label}: {note}" for note in constraint_notes)
        for request in requests:
            at = f"{label} request {request.name!r}"
            if request.admin:
                notes.append(f"{at}: adminAccess holds nothing; not judged")
                continue
            if not request.choices:
                continue  # another driver's request: not hami's to explain
            choices: list[Want] = []
            for choice in request.choices:
                sub = f"{at} subrequest {choice.subrequest!r}" if choice.subrequest else at
                try:
                    want, more = _want(sub, choice, request.name, distinct)
                except RequestError as exc:
                    errors.append(f"{podrequest.pod_name(pod)}: {claim.where}: {exc}")
                    continue
                choices.append(want)
                notes.extend(more)
            if choices:
                wanted.append(Wanted(at, tuple(choices)))
    return PodAsks(tuple(wanted), tuple(pinned), tuple(own), tuple(notes), tuple(errors))
