"""The DRA mode's node score: an extender that only ranks (``scheduler.dra_score``).

In DRA mode kube-scheduler's DynamicResources plugin allocates every claim itself
(docs/dra.md); the one place it takes another's opinion is an extender's
``prioritizeVerb``. This room answers it: kube-scheduler's ``ExtenderArgs`` in, a
``HostPriorityList`` (``[{"Host": name, "Score": 0..10}]``) out, from the ``defrag``
policy's cost of the pod on each candidate (``Cluster.weigh``). It never filters and never
binds; kube-scheduler's allocator still picks the devices on the node it chooses.

The picture is its own ``Cluster`` (policy ``defrag``), fed from watches:

- ResourceSlices of hami's drivers: each node's devices (``hami.dra.inventory``);
- ResourceClaims: the allocated ones' results are holds on those devices; the specs, and
  ResourceClaimTemplates' specs, say what a pod asks (``hami.dra.podrequest``);
- Nodes and Pods: each node's free CPU and memory (``RoomLedger``), which the policy
  weighs as in the extender mode.

A pod with no hami claim, or whose claims cannot be read (an error naming the pod and the
object is logged once per pod and answer), gets no opinion: 0 for every node.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from hami import log
from hami.core.cluster import Cluster
from hami.core.defragpolicy import DEFRAG
from hami.core.noderesources import RoomLedger, pod_requests
from hami.core.requests import DeviceKind, RequestError
from hami.dra import inventory, names, podrequest
from hami.kube.objects import metadata_of, pod_key
from hami.protocol import NodeDevice
from hami.scheduler.clock import utcnow

_log = log.get(__name__)

MAX_PRIORITY = 10  # kube-scheduler's MaxExtenderPriority
_FIELD = "hamiDraDevices"  # where a node's devices ride in the object the Cluster reads
Json = dict[str, Any]
Readiness = Callable[[], str | None]


def priorities(costs: Mapping[str, float], names_: Sequence[str]) -> list[Json]:
    """``HostPriorityList``: each candidate once, in the order given. The cheapest gets
    ``MAX_PRIORITY``, the dearest 1, the others linearly between (rounded); a node with
    no cost (no fit) 0. All the same cost: all ``MAX_PRIORITY``."""
    seen = list(dict.fromkeys(str(n) for n in names_))
    known = [c for n in seen if (c := costs.get(n)) is not None and math.isfinite(c)]
    low, high = (min(known), max(known)) if known else (0.0, 0.0)
    out: list[Json] = []
    for name in seen:
        cost = costs.get(name)
        if cost is None or not math.isfinite(cost):
            score = 0
        elif high == low:
            score = MAX_PRIORITY
        else:
            score = 1 + round((MAX_PRIORITY - 1) * (high - cost) / (high - low))
        out.append({"Host": name, "Score": score})
    return out


def no_opinion(names_: Sequence[str]) -> list[Json]:
    return [{"Host": n, "Score": 0} for n in dict.fromkeys(str(n) for n in names_)]


def candidate_names(args: Mapping[str, Any]) -> list[str]:
    """The candidates of ``ExtenderArgs`` (field names case-insensitive): ``NodeNames``
    (nodeCacheCapable) or the names of ``Nodes.items``."""
    lowered = {str(k).lower(): v for k, v in args.items()}
    listed = lowered.get("nodenames")
    if isinstance(listed, list):
        return [str(n) for n in listed]
    nodes = lowered.get("nodes")
    items = nodes.get("items") if isinstance(nodes, Mapping) else None
    if isinstance(items, list):
        return [str(metadata_of(i).get("name")) for i in items if isinstance(i, Mapping)]
    return []


def _devices_of(word: str) -> Callable[[Mapping[str, Any]], list[NodeDevice] | None]:
    def read(obj: Mapping[str, Any]) -> list[NodeDevice] | None:
        per_type = obj.get(_FIELD)
        devices = per_type.get(word) if isinstance(per_type, Mapping) else None
        return list(devices) if devices else None

    return read


class DraScoreMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Counter(
            "hami_dra_score_total",
            "DRA-mode prioritize calls by outcome (scored, no_claim, unknown_claim, "
            "invalid, not_ready, error)",
            ["outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "hami_dra_score_duration_seconds",
            "Time to answer a DRA-mode prioritize call",
            registry=registry,
        )
        self.object_errors = Counter(
            "hami_dra_score_object_errors_total",
            "ResourceSlice and ResourceClaim contents the DRA-mode score could not read",
            ["kind"],
            registry=registry,
        )


class DraScore:
    def __init__(
        self,
        kinds: Sequence[DeviceKind],
        registry: CollectorRegistry,
        *,
        device_policy: str = "spread",
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.kinds = {
            k.type_word: dataclasses.replace(k, devices_from_node=_devices_of(k.type_word))
            for k in kinds
        }
        self.drivers = {names.driver_name(word): word for word in self.kinds}
        self.classes = {driver: self.kinds[word] for driver, word in self.drivers.items()}
        self.cluster = Cluster(
            list(self.kinds.values()), node_policy=DEFRAG, device_policy=device_policy
        )
        self.rooms = RoomLedger()
        self.metrics = DraScoreMetrics(registry)
        self._now = clock
        self._slices: dict[str, inventory.SliceDevices] = {}  # slice name -> devices
        # node -> its slices' names: a slice event re-reads one node's slices, not all of
        # them (the initial list of N slices would otherwise cost N x N)
        self._node_slices: dict[str, set[str]] = {}
        self._claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._claim_keys: dict[tuple[str, str], set[str]] = {}  # claim -> its hold keys
        self._templates: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._errors: dict[str, str] = {}  # object or pod -> the error logged last

    # ------------------------------------------------------------------ watches

    def on_slice(self, kind: str, obj: Json) -> None:
        name = str(metadata_of(obj).get("name") or "")
        old = self._slices.pop(name, None)
        if old is not None:
            names = self._node_slices.get(old.node)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._node_slices[old.node]
        read = None if kind == "DELETED" else inventory.slice_devices(obj, self.drivers)
        if read is not None:
            self._slices[name] = read
            self._node_slices.setdefault(read.node, set()).add(name)
            self._note("ResourceSlice", f"slice:{name}", read.errors)
        else:
            self._errors.pop(f"slice:{name}", None)
        for node in {s.node for s in (old, read) if s is not None}:
            self._refresh_node(node)

    def _refresh_node(self, node: str) -> None:
        per_type: dict[str, list[NodeDevice]] = {}
        for slice_name in sorted(self._node_slices.get(node, ())):
            devices = self._slices[slice_name]
            per_type.setdefault(devices.type_word, []).extend(devices.devices)
        if not per_type:
            self.cluster.delete_node(node)
            return
        obj = {"metadata": {"name": node}, _FIELD: per_type}
        self.cluster.upsert_node(obj, self._now())
        free = self.rooms.free(node)
        if free is not None:
            self.cluster.set_node_room(node, *free)

    def on_claim(self, kind: str, obj: Json) -> None:
        meta = metadata_of(obj)
        ref = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        for key in self._claim_keys.pop(ref, set()):
            self.cluster.set_hold(key, "", {}, {})
        if kind == "DELETED":
            self._claims.pop(ref, None)
            self._errors.pop(f"claim:{ref[0]}/{ref[1]}", None)
            return
        self._claims[ref] = obj
        holds = inventory.claim_holds(obj, self.drivers)
        self._note("ResourceClaim", f"claim:{ref[0]}/{ref[1]}", holds.errors)
        keys: set[str] = set()
        for node, usage in holds.usage.items():
            key = f"{ref[0]}/{ref[1]}@{node}"
            self.cluster.set_hold(key, node, usage, holds.types)
            keys.add(key)
        if keys:
            self._claim_keys[ref] = keys

    def on_template(self, kind: str, obj: Json) -> None:
        meta = metadata_of(obj)
        ref = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if kind == "DELETED":
            self._templates.pop(ref, None)
        else:
            self._templates[ref] = obj

    def on_node(self, kind: str, obj: Json) -> None:
        name = str(metadata_of(obj).get("name") or "")
        if kind == "DELETED":
            self.rooms.drop_node(name)
            return
        self._rooms_changed(self.rooms.set_node(name, obj))

    def on_pod(self, kind: str, obj: Json) -> None:
        key = pod_key(obj)
        if kind == "DELETED":
            self._errors.pop(f"pod:{key}", None)
            self._rooms_changed(self.rooms.delete_pod(key))
        else:
            self._rooms_changed(self.rooms.upsert_pod(key, obj))

    def _rooms_changed(self, nodes: Collection[str]) -> None:
        for name in nodes:
            free = self.rooms.free(name)
            if free is not None:
                self.cluster.set_node_room(name, *free)

    def _note(self, kind: str, key: str, errors: Sequence[str]) -> None:
        """Log an object's errors once (again only when they change)."""
        text = "; ".join(errors)
        if not text:
            self._errors.pop(key, None)
            return
        if self._errors.get(key) == text:
            return
        self._errors[key] = text
        self.metrics.object_errors.labels(kind).inc()
        _log.warning("DRA score input unreadable", kind=kind, error=text)

    # ------------------------------------------------------------------ prioritize

    def claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._claims.get((namespace, name))

    def template(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._templates.get((namespace, name))

    def prioritize(self, body: Any, not_ready: str | None = None) -> list[Json]:
        """``ExtenderArgs`` -> ``HostPriorityList``; never raises (no opinion instead)."""
        started = time.perf_counter()
        outcome = "error"
        args = body if isinstance(body, Mapping) else {}
        candidates = candidate_names(args)
        try:
            answer, outcome = self._prioritize(args, candidates, not_ready)
            return answer
        except Exception as exc:  # a bug costs this pod's score only
            _log.error("DRA score failed", error=repr(exc), exc_info=True)
            return no_opinion(candidates)
        finally:
            self.metrics.total.labels(outcome).inc()
            self.metrics.seconds.observe(time.perf_counter() - started)

    def _prioritize(
        self, args: Mapping[str, Any], candidates: list[str], not_ready: str | None
    ) -> tuple[list[Json], str]:
        if not_ready is not None:
            _log.debug("DRA score: no opinion, not ready", reason=not_ready)
            return no_opinion(candidates), "not_ready"
        pod = {str(k).lower(): v for k, v in args.items()}.get("pod")
        if not isinstance(pod, Mapping):
            self._note("Pod", "pod:?", ["ExtenderArgs without a Pod: no score"])
            return no_opinion(candidates), "invalid"
        try:
            request = podrequest.pod_request(pod, self.classes, self.claim, self.template)
        except podrequest.UnknownClaim as exc:
            _log.debug("DRA score: no opinion yet", error=str(exc))
            return no_opinion(candidates), "unknown_claim"
        except RequestError as exc:
            self._note("Pod", f"pod:{_pod_ref(pod)}", [f"{exc}; no score for this pod"])
            return no_opinion(candidates), "invalid"
        if request is None:
            return no_opinion(candidates), "no_claim"
        costs = self.cluster.weigh(request, candidates, pod_requests(pod))
        answer = priorities(costs, candidates)
        _log.debug(
            "DRA score",
            pod=_pod_ref(pod),
            scores={a["Host"]: a["Score"] for a in answer},
        )
        return answer, "scored"


def _pod_ref(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod that may be malformed."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
