"""What a pod asks for: per container and device type, parsed from its resource limits.

Pure. The rules (protocol.md section 3):

- ``count`` devices per container; memory, percentage or cores without a count mean the
  kind's ``default_count`` (1; ``scheduler.default_device_count``), which the webhook
  writes into the container so that kubelet calls the device plugin;
- memory in the backend's unit (``memory_unit_mib``: Cambricon counts 256 MiB units);
- no memory and no percentage means 100 % of each device's memory;
- absent cores take the backend's ``default_cores`` (0 for NVIDIA: no core share asked;
  100 for Cambricon MLU: the whole card); 100 means the device is exclusive.

Pod annotations steer the choice: ``{domain}/use-{word}type``, ``nouse-{word}type``
(comma lists, case-insensitive substrings of the model), ``use-{word}uuid``,
``nouse-{word}uuid`` (comma lists, exact uuids), ``{domain}/numa-bind``,
``{domain}/vgpu-mode`` (the device modes allowed, e.g. ``mig``: hami.core.migfit), the two
policy overrides ``hami.io/node-scheduler-policy`` / ``hami.io/gpu-scheduler-policy`` (a
comma list: binpack, spread, numa, mutex, topology-aware) and
``hami.io/device-scoring-weights``. A policy or weights value that is not understood
never rejects the pod: the default is used and ``PodRequest.warnings`` says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from hami.protocol import ContainerDevice, NodeDevice, keys
from hami.protocol.objects import annotations_of, pod_containers, pod_key
from hami.protocol.resources import ResourceNames

if TYPE_CHECKING:
    from hami.core.usage import DeviceState, Use

# hami.io/node-scheduler-policy words; defrag is this project's (hami.core.defragpolicy)
NODE_POLICIES = ("binpack", "spread", "defrag")
# hami.io/gpu-scheduler-policy is a comma-separated ordered list (Go HAMi): sort keys in the
# order written, plus two filters.
SORT_KEYS = ("binpack", "spread", "numa")
MUTEX = "mutex"  # only devices nobody uses
TOPOLOGY = "topology-aware"  # multi-device requests take the best-connected set
DEVICE_POLICY_WORDS = (*SORT_KEYS, MUTEX, TOPOLOGY)
DEVICE_SCORING_WEIGHTS = "hami.io/device-scoring-weights"


class RequestError(ValueError):
    """A pod's request is invalid; the message names the container and what to fix."""


NodeReader = Callable[[Mapping[str, Any]], "list[NodeDevice] | None"]
"""A backend's ``devices_from_node``: a Node object -> its devices of the backend's type (Go
HAMi's ``GetNodeDevices``); None when the node has none; raises ProtocolError when what it
reads is malformed."""

NO_ANNOTATIONS: Mapping[str, str] = MappingProxyType({})


class PodAnnotator(Protocol):
    """A backend's ``pod_annotations``: a decision's devices per container, each device's
    index on its node and the pod's annotations -> further pod annotations Go HAMi writes
    with the decision."""

    def __call__(
        self,
        containers: Sequence[Sequence[ContainerDevice]],
        index_of: Callable[[str], int],
        annotations: Mapping[str, str] = ...,
    ) -> Mapping[str, str]: ...


MemoryReader = Callable[[Any], int]
"""A backend's ``read_memory``: the memory resource's quantity as written -> MiB per device,
where its unit decides the scale (MetaX: a bare number is GiB, a number with a unit bytes);
raises ValueError when it is not a quantity."""

ModeReader = Callable[[Mapping[str, str]], frozenset[str]]
"""A backend's ``pod_needs`` or ``node_offers``: a pod's or a Node's annotations -> the
modes the pod's request needs a node to offer, or the node offers (Ascend: the soft split)."""

ContainerEnv = Callable[[Mapping[str, Any]], Mapping[str, str]]
"""A backend's ``container_env``: a container (a dict) -> environment variables Go HAMi's
webhook sets in it when it asks for the backend's type (Iluvatar: ``SOL_CONTINER_NAME``)."""


class RequestRule(Protocol):
    """A backend's own request rules (``Backend.request_rule``), applied to a container's
    request as the generic rules read it: Go HAMi's per-vendor webhook and request
    derivation (Ascend: memory rounded up to a vNPU template, 910C by 2-NPU module). Returns
    the request the scheduler places; raises RequestError with what to fix. The webhook writes
    the result's count and memory back into the container (``webhook.written``)."""

    def __call__(
        self, request: DeviceRequest, annotations: Mapping[str, str], where: str
    ) -> DeviceRequest: ...


class DevicePicker(Protocol):
    """A vendor's own choice among a node's devices (``DeviceRequest.pick``: Kunlunxin card
    sets, ``hami.core.cardsets``): the node's devices in order, whether each fits the request
    by the generic rules (and ``mutex``), the request and what the pod's earlier containers
    take (uuid -> use) -> the positions in ``devices`` of the devices chosen, None when the
    request does not fit."""

    def __call__(
        self,
        devices: Sequence[DeviceState],
        fits: Sequence[bool],
        request: DeviceRequest,
        overlay: Mapping[str, Use],
    ) -> list[int] | None: ...


@dataclass(frozen=True, slots=True)
class DeviceKind:
    """A backend as the scheduler sees it: words, resource names and annotation keys."""

    type_word: str
    vendor_word: str
    resources: ResourceNames
    allocated_key: str
    to_allocate_key: str
    default_cores: int = 0
    # A container limit HAMi-core reads as the task priority (``nvidia.com/priority``): a
    # managed resource kube-scheduler must ignore, never a device count.
    priority_resource: str | None = None
    # Node keys of the type's heartbeat, the backend's own first (protocol.md §1, §2);
    # empty: the protocol's keys for the type word (NVIDIA: also hami.io/node-handshake).
    handshake_keys: tuple[str, ...] = ()
    # Devices a container gets when it names only memory, percentage or cores (Go HAMi's
    # ``defaultGPUNum``); the webhook adds it as the count resource.
    default_count: int = 1
    # How the scheduler reads a node's devices of this kind when the node has no register
    # value: the backend's ``devices_from_node`` (capacity-based vendors, as Go HAMi 2.10
    # reads Cambricon); None: the register value only (read when it changes).
    devices_from_node: NodeReader | None = None
    # Further pod annotations written with the kind's decision (Go HAMi's Cambricon dsmlu
    # profile); None: only the devices values.
    pod_annotations: PodAnnotator | None = None
    # The words in the selector annotations' keys, (type, uuid): Go HAMi's Hygon reads
    # ``hygon.com/use-dcutype`` and ``hygon.com/use-gpuuuid``; empty: ``selector_word``.
    selector_words: tuple[str, ...] = ()
    # The node's register key where Go HAMi's differs from the protocol's
    # ``hami.io/node-{type}-register`` (Ascend: ``hami.io/node-register-{type}``); empty:
    # the protocol's.
    register_key: str = ""
    # Selector annotation keys by name (``use-uuid``, ``nouse-uuid``, ...) where Go HAMi's
    # differ from ``annotation``'s pattern (Ascend: ``hami.io/use-{type}-uuid``).
    selector_keys: tuple[tuple[str, str], ...] = ()
    # Older keys still read for a selector (name, key), documented here before Go's key was
    # (Cambricon: ``cambricon.com/use-mluuuid`` besides Go's ``use-gpuuuid``). Only one
    # set: it is used; both set: they must name the same values, else the pod is refused.
    selector_aliases: tuple[tuple[str, str], ...] = ()
    # The backend's own request rules (``RequestRule``); None: the generic rules only. With
    # one, the webhook writes the request it returns into the container, as Go HAMi's
    # webhook rewrites an Ascend container's memory to its template.
    request_rule: RequestRule | None = None
    # Whether the cores resource names the cores of all of a container's devices together,
    # as Go HAMi's webhook writes it for Iluvatar (100 x the count) and Moore Threads: the
    # generic rules then refuse only negative cores, ``request_rule`` judges the rest, and the
    # webhook writes the request's cores x count back (``webhook.written``).
    cores_per_container: bool = False
    # The same for the memory resource (Moore Threads): ``request_rule`` derives each
    # device's memory and the webhook writes it x count back.
    memory_per_container: bool = False
    # Environment variables the webhook sets in a container asking for this kind
    # (``ContainerEnv``); None: none.
    container_env: ContainerEnv | None = None
    # How the memory resource is read (``MemoryReader``: its unit decides the scale, and the
    # webhook never rewrites it); None: whole ``memory_unit_mib`` units.
    memory_reader: MemoryReader | None = None
    # Whether a bind of a pod holding devices of this kind takes ``hami.io/mutex.lock``
    # (protocol.md section 5). False where Go HAMi's ``LockNode`` for the type does nothing
    # (Moore Threads, Kunlunxin ``kunlun``, ``Metax-GPU``): the vendor's plug-in never
    # releases the lock, so every later bind on the node would wait for it to go stale.
    node_lock: bool = True
    # Go HAMi's vendor lock for the type, whose value is only the time it was taken
    # (``hami.scheduler.vendorlock``: Cambricon's ``cambricon.com/dsmlu.lock``); "": none.
    vendor_lock: str = ""
    # What a pod's annotations make its request need a node to offer, and what a node's
    # annotations say it offers (``ModeReader``); a node is refused a pod whose needs it does
    # not offer, as Go HAMi's Ascend Fit keeps soft-split pods off nodes without
    # ``hami-vnpu-core: "true"`` (ModeNotFit). None: no such rule for the kind.
    pod_needs: ModeReader | None = None
    node_offers: ModeReader | None = None

    def heartbeat_keys(self) -> tuple[str, ...]:
        return self.handshake_keys or keys.handshake_keys(self.type_word)

    def register_annotation(self) -> str:
        """The node annotation holding this kind's register value."""
        return self.register_key or keys.node_register(self.type_word)

    def managed_resources(self) -> list[str]:
        """Every resource name hami handles for this kind (kube-scheduler ignores them)."""
        names = self.resources.all()
        if self.priority_resource and self.priority_resource not in names:
            names.append(self.priority_resource)
        return names

    @property
    def domain(self) -> str:
        return self.resources.count.split("/", 1)[0] if "/" in self.resources.count else ""

    @property
    def selector_word(self) -> str:
        """``gpu`` for ``nvidia.com/gpu``, ``mlu`` for ``cambricon.com/vmlu``."""
        tail = self.resources.count.rsplit("/", 1)[-1]
        if tail.startswith("v") and len(tail) > 3:
            tail = tail[1:]
        return tail

    def annotation(self, name: str) -> str:
        """Selector annotation key: ``use-type`` -> ``nvidia.com/use-gputype``."""
        for known, key in self.selector_keys:
            if known == name:
                return key
        prefix = f"{self.domain}/" if self.domain else ""
        if name == "numa-bind":
            return f"{prefix}numa-bind"
        verb, what = name.split("-", 1)
        word = self.selector_word
        if self.selector_words:
            word = self.selector_words[0] if what == "type" else self.selector_words[1]
        return f"{prefix}{verb}-{word}{what}"

    @classmethod
    def from_backend(cls, backend: Any) -> DeviceKind:
        """Build from a ``hami.backends.base.Backend`` instance (duck-typed)."""
        return cls(
            type_word=backend.type_word,
            vendor_word=backend.vendor_word,
            resources=backend.resources,
            allocated_key=backend.allocated_key,
            to_allocate_key=backend.to_allocate_key,
            default_cores=int(getattr(backend, "default_cores", 0)),
            priority_resource=getattr(backend, "priority_resource", None),
            handshake_keys=tuple(getattr(backend, "handshake_keys", ())),
            devices_from_node=getattr(backend, "node_reader", None),
            pod_annotations=getattr(backend, "pod_annotator", None),
            selector_words=getattr(backend, "selector_words", ()),
            register_key=str(getattr(backend, "register_key", "")),
            selector_keys=tuple(getattr(backend, "selector_keys", ())),
            selector_aliases=tuple(getattr(backend, "selector_aliases", ())),
            request_rule=getattr(backend, "request_rule", None),
            cores_per_container=bool(getattr(backend, "cores_per_container", False)),
            memory_per_container=bool(getattr(backend, "memory_per_container", False)),
            container_env=getattr(backend, "env_writer", None),
            memory_reader=getattr(backend, "read_memory", None),
            node_lock=bool(getattr(backend, "node_lock", True)),
            vendor_lock=str(getattr(backend, "vendor_lock", "")),
            pod_needs=getattr(backend, "pod_needs", None),
            node_offers=getattr(backend, "node_offers", None),
        )


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One container's request for one device type."""

    type_word: str
    vendor: str  # vendor word written in pod device values
    count: int
    memory: int  # MiB per device; 0 when ``memory_percentage`` is set
    memory_percentage: int | None  # percent of each device's memory, or None
    cores: int  # percent of each device; 100 = exclusive
    # Devices come in modules of this many (consecutive indices, index // module): a request
    # takes whole modules only (Ascend 910C: 2 NPUs per module). 1: any devices.
    module: int = 1
    # The vendor's own choice of devices (``DevicePicker``), set by its request rule; None:
    # the policy's ranking picks.
    pick: DevicePicker | None = None

    def memory_on(self, device_memory: int) -> int:
        if self.memory_percentage is None:
            return self.memory
        return device_memory * self.memory_percentage // 100


@dataclass(frozen=True, slots=True)
class Selectors:
    use_types: tuple[str, ...] = ()  # lower-case substrings of the model
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    numa_bind: bool = False
    # ``{domain}/vgpu-mode`` as written (None: absent): a device's mode must be in it
    vgpu_mode: str | None = None
    # What the pod's request needs a node to offer (``DeviceKind.pod_needs``: Ascend's soft
    # split needs ``hami-vnpu-core``); empty: any node of the type.
    needs: frozenset[str] = frozenset()

    def type_ok(self, model: str) -> bool:
        lowered = model.lower()
        if self.use_types and not any(t in lowered for t in self.use_types):
            return False
        return not any(t in lowered for t in self.nouse_types)

    def uuid_ok(self, uuid: str) -> bool:
        if self.use_uuids and uuid not in self.use_uuids:
            return False
        return uuid not in self.nouse_uuids


NO_SELECTORS = Selectors()


@dataclass(frozen=True, slots=True)
class Weights:
    """``hami.io/device-scoring-weights``: how much slots, cores and memory count in a
    device's utilisation score (Go HAMi's per-pod weights; all 1 by default)."""

    slot: int = 1
    core: int = 1
    memory: int = 1


DEFAULT_WEIGHTS = Weights()


@dataclass(frozen=True, slots=True)
class DevicePolicy:
    """A device policy value as Go HAMi reads it: ``binpack,numa``, ``mutex``, ...

    ``sort_keys`` are binpack/spread/numa in the order written (no duplicates); none
    means spread, as in Go HAMi. ``mutex`` and ``topology`` are filters, not sort keys.
    """

    sort_keys: tuple[str, ...] = ("spread",)
    mutex: bool = False
    topology: bool = False


@dataclass(frozen=True, slots=True)
class PodRequest:
    """All containers (init first, then app, each in spec order) and their requests."""

    containers: tuple[tuple[DeviceRequest, ...], ...]
    init_count: int
    selectors: Mapping[str, Selectors]  # by type word
    node_policy: str | None = None
    # The known words of hami.io/gpu-scheduler-policy, comma-joined (``binpack,numa``);
    # None: the scheduler's default. Read with ``device_policy_of``.
    device_policy: str | None = None
    weights: Weights = DEFAULT_WEIGHTS
    # Annotation values that were not understood and fell back to the default: the
    # scheduler reports them in a warning Event, never rejects the pod for them.
    warnings: tuple[str, ...] = ()

    @property
    def type_words(self) -> list[str]:
        seen: dict[str, None] = {}
        for container in self.containers:
            for request in container:
                seen.setdefault(request.type_word, None)
        return list(seen)

    def selectors_for(self, type_word: str) -> Selectors:
        return self.selectors.get(type_word, NO_SELECTORS)


# ---------------------------------------------------------------- quantities

_INT64 = re.compile(r"[+-]?[0-9]{1,19}")
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def parse_quantity(value: Any) -> int:
    """A Kubernetes quantity that must be a whole number (``3000``, ``2k``); else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a whole number")
    number, suffix = match.groups()
    if suffix == "m":  # milli: only whole numbers survive
        scale = Decimal(1) / 1000
    elif suffix in _SUFFIX:
        scale = Decimal(_SUFFIX[suffix])
    else:
        raise ValueError(f"{text!r} has an unknown unit {suffix!r}")
    try:
        amount = Decimal(number) * scale
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a number") from None
    if amount != amount.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number")
    return int(amount)


# ---------------------------------------------------------------- parsing


def container_resources(container: Mapping[str, Any]) -> Mapping[str, Any]:
    """Limits, falling back to requests for names only in requests."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if not requests:
        return dict(limits)
    merged = dict(requests)
    merged.update(limits)
    return merged


def asks_for(container: Mapping[str, Any], kinds: Iterable[DeviceKind]) -> bool:
    names = container_resources(container)
    return any(name in names for kind in kinds for name in kind.managed_resources())


def parse_device_request(
    resources: Mapping[str, Any],
    kind: DeviceKind,
    where: str,
    annotations: Mapping[str, str] = NO_ANNOTATIONS,
) -> DeviceRequest | None:
    """One container's request for ``kind``, or None when it asks for none of it; the
    kind's own ``request_rule`` (with the pod's ``annotations``) has the last word."""
    names = kind.resources
    present = {name: resources[name] for name in names.all() if name in resources}
    if not present:
        return None

    def number(name: str | None) -> int | None:
        if name is None or name not in present:
            return None
        try:
            return parse_quantity(present[name])
        except ValueError as exc:
            raise RequestError(f"{where}: {name}: {exc}; use a whole number") from None

    count = number(names.count)
    memory = number(names.memory)
    if memory is not None and kind.memory_reader is not None and names.memory is not None:
        try:
            memory = kind.memory_reader(present[names.memory])
        except ValueError as exc:
            raise RequestError(f"{where}: {names.memory}: {exc}") from None
    percentage = number(names.memory_percentage)
    cores = number(names.cores)
    if count is None:
        count = kind.default_count
    if count == 0 and names.count in present:
        return None  # explicitly zero devices: no request
    if count < 0:
        raise RequestError(f"{where}: {names.count} must be >= 1, got {count}")
    if memory is not None:
        if memory <= 0:
            raise RequestError(f"{where}: {names.memory} must be > 0, got {memory}")
        if kind.memory_reader is None:
            memory *= names.memory_unit_mib
        percentage = None
    elif percentage is not None:
        if not 1 <= percentage <= 100:
            raise RequestError(
                f"{where}: {names.memory_percentage} must be between 1 and 100, got {percentage}"
            )
    else:
        percentage = 100
    if cores is None:
        cores = kind.default_cores
    elif kind.cores_per_container and cores < 0:
        raise RequestError(f"{where}: {names.cores} must be >= 0, got {cores}")
    elif not kind.cores_per_container and not 0 <= cores <= 100:
        raise RequestError(f"{where}: {names.cores} must be between 0 and 100, got {cores}")
    request = DeviceRequest(
        type_word=kind.type_word,
        vendor=kind.vendor_word,
        count=count,
        memory=memory or 0,
        memory_percentage=percentage,
        cores=cores,
    )
    if kind.request_rule is not None:
        return kind.request_rule(request, annotations, where)
    return request


def _check_priority(resources: Mapping[str, Any], kind: DeviceKind, where: str) -> None:
    """The task priority limit must be a whole number >= 0 (HAMi-core: 0 high, 1 low)."""
    name = kind.priority_resource
    if not name or name not in resources:
        return
    try:
        value = parse_quantity(resources[name])
    except ValueError as exc:
        raise RequestError(f"{where}: {name}: {exc}; use 0 (high) or 1 (low)") from None
    if value < 0:
        raise RequestError(f"{where}: {name} must be 0 (high) or 1 (low), got {value}")


def _comma_list(value: str | None) -> list[str]:
    if not value:
        return []
    return [part.strip() for part in value.split(",") if part.strip()]


def _selector_list(
    annotations: Mapping[str, str], kind: DeviceKind, name: str, where: str
) -> list[str]:
    """The values of selector ``name`` under its key or an older alias of it; both set with
    different values is ambiguous, so the pod is refused rather than one silently ignored."""
    key = kind.annotation(name)
    values = _comma_list(annotations.get(key))
    for alias_name, alias in kind.selector_aliases:
        old = _comma_list(annotations.get(alias)) if alias_name == name else []
        if not old:
            continue
        if values and set(old) != set(values):
            raise RequestError(
                f"{where}: annotations {key}={','.join(values)[:100]!r} and {alias}="
                f"{','.join(old)[:100]!r} disagree; set only {key} ({alias} is its older name)"
            )
        values = values or old
    return values


def parse_selectors(
    annotations: Mapping[str, str], kind: DeviceKind, where: str = "pod"
) -> Selectors:
    """The pod's selector annotations for ``kind``; RequestError (naming ``where``) when a
    key and its older alias disagree."""
    use_types = tuple(t.lower() for t in _selector_list(annotations, kind, "use-type", where))
    nouse_types = tuple(t.lower() for t in _selector_list(annotations, kind, "nouse-type", where))
    use_uuids = frozenset(_selector_list(annotations, kind, "use-uuid", where))
    nouse_uuids = frozenset(_selector_list(annotations, kind, "nouse-uuid", where))
    numa = (annotations.get(kind.annotation("numa-bind")) or "").strip().lower() == "true"
    mode = annotations.get(f"{kind.domain}/vgpu-mode") if kind.domain else None
    needs = kind.pod_needs(annotations) if kind.pod_needs is not None else frozenset()
    if not (use_types or nouse_types or use_uuids or nouse_uuids or numa or needs) and mode is None:
        return NO_SELECTORS
    return Selectors(use_types, nouse_types, use_uuids, nouse_uuids, numa, mode, needs)


def _node_policy(annotations: Mapping[str, str], warnings: list[str]) -> str | None:
    key = keys.NODE_SCHEDULER_POLICY
    value = (annotations.get(key) or "").strip().lower()
    if not value:
        return None
    if value not in NODE_POLICIES:
        warnings.append(
            f"annotation {key}: unknown policy {value!r} (expected binpack, spread or "
            "defrag); "
            "the scheduler's default node policy is used"
        )
        return None
    return value


def _device_policy(annotations: Mapping[str, str], warnings: list[str]) -> str | None:
    """The known words of the comma list, in order; unknown ones are reported and dropped."""
    key = keys.DEVICE_SCHEDULER_POLICY
    value = annotations.get(key)
    if value is None or not value.strip():
        return None
    known: list[str] = []
    unknown: list[str] = []
    for word in value.split(","):
        word = word.strip().lower()
        if word in DEVICE_POLICY_WORDS:
            if word not in known:
                known.append(word)
        elif word:
            unknown.append(word)
    if unknown:
        default = "the rest of it" if known else "the scheduler's default device policy"
        warnings.append(
            f"annotation {key}: unknown policy {', '.join(map(repr, unknown))[:200]} "
            f"(known: {', '.join(DEVICE_POLICY_WORDS)}); {default} is used"
        )
    return ",".join(known) or None


def device_policy_of(text: str) -> DevicePolicy:
    """Read a device policy value (the pod's or the scheduler's default)."""
    words = [word.strip().lower() for word in text.split(",")]
    sort_keys = tuple(dict.fromkeys(w for w in words if w in SORT_KEYS))
    return DevicePolicy(sort_keys or ("spread",), MUTEX in words, TOPOLOGY in words)


def parse_weights(value: str) -> Weights:
    """``slot=1,core=1,memory=3`` as Go HAMi reads it: all three, each once, integers
    >= 0, at least one above 0; else ValueError saying what is wrong."""
    parts = value.split(",")
    if len(parts) != 3:
        raise ValueError("expected slot, core and memory weights, e.g. slot=1,core=1,memory=3")
    found: dict[str, int] = {}
    for part in parts:
        name, sep, number = part.strip().partition("=")
        name = name.strip()
        if not sep:
            raise ValueError("expected key=value entries, e.g. slot=1,core=1,memory=3")
        if name in found:
            raise ValueError(f"duplicate {name!r} weight")
        number = number.strip()
        if not _INT64.fullmatch(number) or abs(int(number)) >= 2**63:
            raise ValueError(f"{name!r} weight must be an integer")
        weight = int(number)
        if weight < 0:
            raise ValueError(f"{name!r} weight must not be negative")
        if name not in ("slot", "core", "memory"):
            raise ValueError(f"unknown weight {name!r} (known: slot, core, memory)")
        found[name] = weight
    if not any(found.values()):
        raise ValueError("at least one weight must be positive")
    return Weights(found["slot"], found["core"], found["memory"])


def _weights(annotations: Mapping[str, str], warnings: list[str]) -> Weights:
    value = annotations.get(DEVICE_SCORING_WEIGHTS)
    if value is None:
        return DEFAULT_WEIGHTS
    try:
        return parse_weights(value)
    except ValueError as exc:
        # Go HAMi refuses to schedule such a pod; here it is scheduled with equal weights.
        warnings.append(
            f"annotation {DEVICE_SCORING_WEIGHTS}: {value[:100]!r}: {exc}; "
            "the default weights slot=1,core=1,memory=1 are used"
        )
        return DEFAULT_WEIGHTS


def parse_pod(pod: Mapping[str, Any], kinds: Sequence[DeviceKind]) -> PodRequest | None:
    """The pod's device request, or None when it asks for no managed resource."""
    containers, init_count = pod_containers(pod)
    parsed: list[tuple[DeviceRequest, ...]] = []
    any_request = False
    name = pod_key(pod)
    annotations = annotations_of(pod)
    for position, container in enumerate(containers):
        kind_word = "init container" if position < init_count else "container"
        where = f"pod {name} {kind_word} {container.get('name', position)!r}"
        resources = container_resources(container)
        found: list[DeviceRequest] = []
        for kind in kinds:
            _check_priority(resources, kind, where)
            request = parse_device_request(resources, kind, where, annotations)
            if request is not None:
                found.append(request)
        any_request = any_request or bool(found)
        parsed.append(tuple(found))
    if not any_request:
        return None
    types = {r.type_word for c in parsed for r in c}
    selectors = {
        kind.type_word: parse_selectors(annotations, kind, f"pod {name}")
        for kind in kinds
        if kind.type_word in types
    }
    warnings: list[str] = []
    return PodRequest(
        containers=tuple(parsed),
        init_count=init_count,
        selectors={t: s for t, s in selectors.items() if s is not NO_SELECTORS},
        node_policy=_node_policy(annotations, warnings),
        device_policy=_device_policy(annotations, warnings),
        weights=_weights(annotations, warnings),
        warnings=tuple(warnings),
    )
