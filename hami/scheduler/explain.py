"""Why each node would (not) take a pod, from the scheduler's current picture (``hami
explain`` and the role's /explain endpoint). A pod that names DRA claims is answered from
the claims and ResourceSlices instead (``hami.scheduler.draexplain``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami import log
from hami.core.cluster import Cluster
from hami.core.quota import QuotaStatus
from hami.core.requests import PodRequest, RequestError
from hami.kube.client import Kube
from hami.kube.objects import annotations_of, pod_key
from hami.protocol import keys
from hami.scheduler import draexplain

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
        if waits_on_claims(pod, self.parse):
            dra = await draexplain.explain(self._kube(), pod)
            if dra is not None:
                return dra
        answer = self.explain_pod(pod)
        nodes: dict[str, str] = answer.get("nodes") or {}
        if _waits_outside_hami(pod, nodes):
            # hami's devices fit: kube-scheduler's own reason is the one that matters
            answer["scheduler_message"] = await self._failed_scheduling(pod)
        return answer

    async def _failed_scheduling(self, pod: Mapping[str, Any]) -> str:
        """kube-scheduler's latest FailedScheduling message for the pod ("" if none)."""
        return await draexplain.latest_failed_scheduling(self._kube(), pod)

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


def waits_on_claims(
    pod: Mapping[str, Any], parse: Callable[[Mapping[str, Any]], PodRequest | None]
) -> bool:
    """Whether the pod is the DRA mode's: it names claims and asks hami no device through
    extended resources (a pod with both, e.g. a NIC claim beside ``nvidia.com/gpu``, is the
    extender's, and is explained without reading claims it may have no right to read)."""
    if not draexplain.names_claims(pod):
        return False
    try:
        return parse(pod) is None
    except RequestError:
        return False


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
