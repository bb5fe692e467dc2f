"""Namespace quotas on device memory and cores, enforced the way Go HAMi enforces them.

Pure. A ``ResourceQuota`` whose ``spec.hard`` names ``limits.<memory resource>`` or
``limits.<cores resource>`` of an enabled backend (``limits.nvidia.com/gpumem``,
``limits.nvidia.com/gpucores``) caps what that namespace's pods hold on devices:

- a pod's hold is what ``hami.core.usage`` counts per device (init containers at their
  peak), summed over its devices: memory in MiB (a percentage request counts the MiB it
  takes on the device chosen; two devices of 3000 MiB count 6000), cores in percent of one
  device (two devices at 30 % count 60);
- a memory limit is written in the backend's memory unit and scaled to MiB
  (``memory_unit_mib``: Cambricon counts 256 MiB units), as HAMi scales it by its memory
  factor; a cores limit is in percent;
- an explicit ``0`` blocks any hold of that resource; a key that is absent limits nothing;
- several ResourceQuota objects of one namespace that name the same key all apply: the
  smallest limit wins (Kubernetes' rule; Go HAMi keeps whichever it saw last);
- only pods placed after a limit is set are held to it: usage already above a new limit
  stays, and the next pod waits (as with Kubernetes' own quotas).

kube-apiserver stores these ``limits.`` keys but never enforces them (extended resources
are quota'd by the API server only as ``requests.<name>``), so this is the only check.

Usage is kept incrementally: the cluster state calls ``hold`` whenever a pod's record (a
reservation, a decision, a bound pod) is added or dropped, so a check is a few dict look-ups.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.requests import DeviceKind, PodRequest, parse_quantity
from hami.core.usage import Use
from hami.protocol.objects import metadata_of

QUOTA_EXCEEDED = "QuotaExceeded"
PREFIX = "limits."
MEMORY = "memory"
CORES = "cores"


@dataclass(frozen=True, slots=True)
class QuotaResource:
    """One resource a quota may limit: a backend's memory or cores resource."""

    name: str  # e.g. nvidia.com/gpumem
    type_word: str
    what: str  # MEMORY or CORES
    unit_mib: int = 1  # MiB per unit of a memory limit (1 for cores)

    @property
    def key(self) -> str:
        """The ResourceQuota key, e.g. ``limits.nvidia.com/gpumem``."""
        return PREFIX + self.name

    @property
    def unit(self) -> str:
        return "MiB" if self.what == MEMORY else "%"

    def scaled(self, limit: int) -> int:
        """A limit as written in the ResourceQuota, in the unit usage is counted in."""
        return limit * self.unit_mib if self.what == MEMORY else limit


@dataclass(frozen=True, slots=True)
class QuotaStatus:
    """One limited (or used) resource of one namespace, for metrics and explain."""

    namespace: str
    resource: QuotaResource
    used: int  # MiB or percent, every pod's hold in the namespace
    limit: int | None  # as written in the ResourceQuota; None: no limit set
    quota: str | None  # name of the ResourceQuota whose limit applies

    @property
    def limit_scaled(self) -> int | None:
        return None if self.limit is None else self.resource.scaled(self.limit)


def quota_resources(kinds: Iterable[DeviceKind]) -> dict[str, QuotaResource]:
    """Every resource a quota may limit, by resource name (the first backend wins)."""
    found: dict[str, QuotaResource] = {}
    for kind in kinds:
        names = kind.resources
        if names.memory:
            found.setdefault(
                names.memory,
                QuotaResource(names.memory, kind.type_word, MEMORY, names.memory_unit_mib),
            )
        if names.cores:
            found.setdefault(names.cores, QuotaResource(names.cores, kind.type_word, CORES))
    return found


def namespace_of(key: str) -> str:
    """The namespace of a ``namespace/name`` key."""
    return key.partition("/")[0]


class Quotas:
    """Per namespace: the limits of its ResourceQuota objects and its pods' device holds."""

    def __init__(self, kinds: Iterable[DeviceKind]) -> None:
        kinds = list(kinds)
        self.resources = quota_resources(kinds)
        self._by_type: dict[str, list[QuotaResource]] = {}
        for resource in self.resources.values():
            self._by_type.setdefault(resource.type_word, []).append(resource)
        # With one backend every uuid is its; with several a hold must name its type.
        self._only_type = kinds[0].type_word if len(kinds) == 1 else None
        # namespace -> quota name -> resource name -> limit as written
        self._objects: dict[str, dict[str, dict[str, int]]] = {}
        self._errors: dict[str, tuple[str, ...]] = {}  # namespace/name -> last errors
        # namespace -> resource name -> (smallest limit, the quota that sets it)
        self._limits: dict[str, dict[str, tuple[int, str]]] = {}
        self._used: dict[str, dict[str, int]] = {}  # namespace -> resource name -> held

    # ------------------------------------------------------------------ limits

    def upsert(self, obj: Mapping[str, Any]) -> list[str]:
        """Take a ResourceQuota; returns its unreadable values when they changed.

        Only ``limits.`` keys of managed resources are read; an unreadable value is
        ignored (that key limits nothing) and reported once, not on every status update.
        """
        meta = metadata_of(obj)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        spec = obj.get("spec")
        hard = spec.get("hard") if isinstance(spec, Mapping) else None
        limits: dict[str, int] = {}
        errors: list[str] = []
        for key, value in hard.items() if isinstance(hard, Mapping) else ():
            resource = self._resource_of_key(str(key))
            if resource is None:
                continue
            limit = _whole(value)
            if limit is None or limit < 0:
                errors.append(
                    f"ResourceQuota {namespace}/{name}: spec.hard[{key}] = {value!r} is not a "
                    f"whole number >= 0 of {resource.unit}; this key limits nothing"
                )
                continue
            limits[resource.name] = limit
        objects = self._objects.setdefault(namespace, {})
        if limits:
            objects[name] = limits
        else:
            objects.pop(name, None)
        self._recompute(namespace)
        key = f"{namespace}/{name}"
        previous = self._errors.get(key, ())
        if errors:
            self._errors[key] = tuple(errors)
        else:
            self._errors.pop(key, None)
        return errors if tuple(errors) != previous else []

    def delete(self, namespace: str, name: str) -> None:
        self._errors.pop(f"{namespace}/{name}", None)
        objects = self._objects.get(namespace)
        if objects is not None and objects.pop(name, None) is not None:
            self._recompute(namespace)

    def _resource_of_key(self, key: str) -> QuotaResource | None:
        if not key.startswith(PREFIX):
            return None
        return self.resources.get(key[len(PREFIX) :])

    def _recompute(self, namespace: str) -> None:
        smallest: dict[str, tuple[int, str]] = {}
        objects = self._objects.get(namespace) or {}
        for name in sorted(objects):
            for resource, limit in objects[name].items():
                current = smallest.get(resource)
                if current is None or limit < current[0]:
                    smallest[resource] = (limit, name)
        if smallest:
            self._limits[namespace] = smallest
        else:
            self._limits.pop(namespace, None)
            self._objects.pop(namespace, None)

    # ------------------------------------------------------------------ usage

    def charge(self, usage: Mapping[str, Use], types: Mapping[str, str]) -> dict[str, int]:
        """Per resource name, what a hold counts: ``usage`` is uuid -> hold, ``types``
        uuid -> device type (a uuid of no known type counts only with a single backend)."""
        charged: dict[str, int] = {}
        for uuid, use in usage.items():
            word = types.get(uuid, self._only_type)
            for resource in self._by_type.get(word or "", ()):
                amount = use.memory if resource.what == MEMORY else use.cores
                if amount:
                    charged[resource.name] = charged.get(resource.name, 0) + amount
        return charged

    def hold(self, key: str, usage: Mapping[str, Use], types: Mapping[str, str], sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) the hold of pod ``key`` (``namespace/name``)."""
        namespace = namespace_of(key)
        used = self._used.setdefault(namespace, {})
        for name, amount in self.charge(usage, types).items():
            total = used.get(name, 0) + sign * amount
            if total:
                used[name] = total
            else:
                used.pop(name, None)
        if not used:
            del self._used[namespace]

    # ------------------------------------------------------------------ checks

    def exceeded(self, namespace: str, charge: Mapping[str, int]) -> str | None:
        """Why ``charge`` (resource name -> amount) does not fit the namespace's quota,
        or None when it does. The reason starts with ``QuotaExceeded:``."""
        limits = self._limits.get(namespace)
        if not limits:
            return None
        used = self._used.get(namespace) or {}
        for name in sorted(charge):
            amount = charge[name]
            found = limits.get(name)
            if found is None or amount <= 0:
                continue
            limit, quota = found
            resource = self.resources[name]
            cap = resource.scaled(limit)
            held = used.get(name, 0)
            if held + amount > cap:
                unit = resource.unit
                return (
                    f"{QUOTA_EXCEEDED}: namespace {namespace} has {held}{unit} of "
                    f"{resource.key} in use and the pod needs {amount}{unit} more; "
                    f"ResourceQuota {quota} allows {cap}{unit}"
                )
        return None

    def exceeded_by_hold(
        self, namespace: str, usage: Mapping[str, Use], types: Mapping[str, str]
    ) -> str | None:
        """``exceeded`` for a hold (uuid -> use) about to be made."""
        if namespace not in self._limits:
            return None
        return self.exceeded(namespace, self.charge(usage, types))

    def precheck(self, namespace: str, request: PodRequest) -> str | None:
        """A quick ``exceeded`` before any node is fitted, with the least the pod can hold
        anywhere: absolute memory and cores, times the device count; app containers add
        up and each init container counts alone (they run one at a time); a percentage
        of memory counts 0 here (its MiB depend on the device, checked per node)."""
        if namespace not in self._limits:
            return None
        return self.exceeded(namespace, least_charge(request, self._by_type))

    # ------------------------------------------------------------------ views

    def status(self, namespace: str) -> list[QuotaStatus]:
        """The namespace's limited or used resources, sorted by name."""
        limits = self._limits.get(namespace) or {}
        used = self._used.get(namespace) or {}
        rows: list[QuotaStatus] = []
        for name in sorted(set(limits) | set(used)):
            limit, quota = limits.get(name, (None, None))
            rows.append(
                QuotaStatus(namespace, self.resources[name], used.get(name, 0), limit, quota)
            )
        return rows

    def rows(self) -> Iterator[QuotaStatus]:
        for namespace in sorted(set(self._limits) | set(self._used)):
            yield from self.status(namespace)

    def used(self, namespace: str) -> dict[str, int]:
        """Resource name -> held, for tests and tools."""
        return dict(self._used.get(namespace) or {})


def least_charge(
    request: PodRequest, by_type: Mapping[str, Iterable[QuotaResource]]
) -> dict[str, int]:
    """The least a pod can hold, per resource name, wherever it is placed."""
    app: dict[str, int] = {}
    init: dict[str, int] = {}
    for position, container in enumerate(request.containers):
        mine: dict[str, int] = {}
        for item in container:
            for resource in by_type.get(item.type_word, ()):
                per_device = item.memory if resource.what == MEMORY else item.cores
                if item.memory_percentage is not None and resource.what == MEMORY:
                    per_device = 0
                mine[resource.name] = mine.get(resource.name, 0) + per_device * item.count
        target = init if position < request.init_count else app
        for name, amount in mine.items():
            if target is init:
                init[name] = max(init.get(name, 0), amount)
            else:
                app[name] = app.get(name, 0) + amount
    return {name: max(app.get(name, 0), init.get(name, 0)) for name in set(app) | set(init)}


def _whole(value: Any) -> int | None:
    """A quota value as a whole number (``10k``, ``20480``), or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, str | int) or len(str(value)) > 64:
        return None
    try:
        return parse_quantity(value)
    except (ValueError, ArithmeticError):
        return None
