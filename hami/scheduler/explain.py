"""Why each node would (not) take a pod, from the scheduler's current picture (``hami
explain`` and the role's /explain endpoint)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami import log
from hami.core.cluster import Cluster
from hami.core.quota import QuotaStatus
from hami.core.requests import PodRequest, RequestError
from hami.kube.client import Kube
from hami.kube.objects import annotations_of, metadata_of, pod_key
from hami.kube.raw import KubeError
from hami.protocol import keys

_log = log.get(__name__)

Json = dict[str, Any]


class Explainer:
    def __init__(
        self,
        cluster: Cluster,
        kube: Callable[[], Kube],
        parse: Callable[[Mapping[str, Any]], PodRequest | None],
    ) -> None:
        self.cluster = cluster
        self._kube = kube
        self.parse = parse

    async def explain(self, namespace: str, name: str) -> Json:
        """The pod read fresh, judged against every node."""
        pod = await self._kube().get_pod(namespace, name)
        answer = self.explain_pod(pod)
        nodes: dict[str, str] = answer.get("nodes") or {}
        if _waits_outside_hami(pod, nodes):
            # hami's devices fit: kube-scheduler's own reason is the one that matters
            answer["scheduler_message"] = await self._failed_scheduling(pod)
        return answer

    async def _failed_scheduling(self, pod: Mapping[str, Any]) -> str:
        """kube-scheduler's latest FailedScheduling message for the pod ("" if none)."""
        meta = metadata_of(pod)
        namespace = str(meta.get("namespace") or "")
        selector = f"involvedObject.uid={meta.get('uid', '')},reason=FailedScheduling"
        try:
            found, _ = await self._kube().list_all(
                f"/api/v1/namespaces/{namespace}/events", query=(("fieldSelector", selector),)
            )
        except KubeError as exc:  # the node reasons stand on their own
            _log.warning("events not read", pod=pod_key(pod), error=str(exc))
            return ""
        latest = max(found, key=_event_time, default=None)
        return str(latest.get("message") or "") if isinstance(latest, Mapping) else ""

    def explain_pod(self, pod: Mapping[str, Any]) -> Json:
        key = pod_key(pod)
        try:
            request = self.parse(pod)
        except RequestError as exc:
            return {"pod": key, "error": str(exc), "nodes": {}}
        if request is None:
            return {"pod": key, "error": "the pod asks for no device hami manages", "nodes": {}}
        namespace = key.partition("/")[0]
        # a placed pod's own hold is not held against it: explain as if it were not there yet
        # (synchronous, so no filter runs in between)
        own = self.cluster.pods.get(key)
        if own is not None:
            self.cluster.release(key)
        try:
            reasons = self.cluster.explain(request, sorted(self.cluster.nodes), namespace=namespace)
        finally:
            if own is not None:
                self.cluster.rollback(key, own)
        # a reservation (filter chose, bind not yet written) is assigned too
        assigned = annotations_of(pod).get(keys.VGPU_NODE) or (own.node if own else "")
        return {
            "pod": key,
            "error": "",
            "assigned": assigned,
            "nodes": {node: reason or "fits" for node, reason in reasons.items()},
            "quota": quota_view(self.cluster.quotas.status(namespace)),
        }


def quota_view(rows: Sequence[QuotaStatus]) -> Json:
    """Resource -> used/limit (in MiB or %) for explain; limit None: not limited."""
    return {
        row.resource.name: {
            "used": row.used,
            "limit": row.limit_scaled,
            "unit": row.resource.unit,
            "quota": row.quota,
        }
        for row in rows
    }


def _waits_outside_hami(pod: Mapping[str, Any], nodes: Mapping[str, str]) -> bool:
    spec = pod.get("spec")
    status = pod.get("status")
    unbound = not (isinstance(spec, Mapping) and spec.get("nodeName"))
    pending = not isinstance(status, Mapping) or status.get("phase", "Pending") == "Pending"
    return unbound and pending and bool(nodes) and all(r == "fits" for r in nodes.values())


def _event_time(event: Any) -> str:
    """An Event's latest time as an RFC 3339 string (they sort as text)."""
    if not isinstance(event, Mapping):
        return ""
    series = event.get("series")
    last = series.get("lastObservedTime") if isinstance(series, Mapping) else None
    return str(last or event.get("lastTimestamp") or event.get("eventTime") or "")
