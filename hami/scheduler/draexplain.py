"""``hami explain`` for a pod waiting on DRA claims, the I/O: reads the pod's templates,
every ResourceClaim (the allocated ones hold devices), the ResourceSlices and the Nodes
from the API server, and kube-scheduler's latest FailedScheduling message; the reasoning
is ``hami.dra.explainpod``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from hami import log
from hami.dra import explainpod
from hami.kube.client import Kube
from hami.kube.objects import metadata_of, pod_key
from hami.kube.raw import KubeError

_log = log.get(__name__)

RESOURCE_API = "/apis/resource.k8s.io/v1"
Json = dict[str, Any]


def names_claims(pod: Mapping[str, Any]) -> bool:
    """Whether the pod names any ResourceClaim (so the DRA reading applies)."""
    spec = pod.get("spec")
    refs = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    return isinstance(refs, list) and bool(refs)


async def latest_failed_scheduling(kube: Kube, pod: Mapping[str, Any]) -> str:
    """kube-scheduler's latest FailedScheduling message for the pod ("" if none)."""
    meta = metadata_of(pod)
    namespace = str(meta.get("namespace") or "")
    selector = f"involvedObject.uid={meta.get('uid', '')},reason=FailedScheduling"
    try:
        found, _ = await kube.list_all(
            f"/api/v1/namespaces/{namespace}/events", query=(("fieldSelector", selector),)
        )
    except KubeError as exc:  # the node reasons stand on their own
        _log.warning("events not read", pod=pod_key(pod), error=str(exc))
        return ""
    latest = max(found, key=_event_time, default=None)
    return str(latest.get("message") or "") if isinstance(latest, Mapping) else ""


def _event_time(event: Any) -> str:
    """An Event's latest time as an RFC 3339 string (they sort as text)."""
    if not isinstance(event, Mapping):
        return ""
    series = event.get("series")
    last = series.get("lastObservedTime") if isinstance(series, Mapping) else None
    return str(last or event.get("lastTimestamp") or event.get("eventTime") or "")


async def _templates(kube: Kube, pod: Mapping[str, Any]) -> dict[tuple[str, str], Json]:
    """The pod's namespace's ResourceClaimTemplates, listed (the right the DRA score's
    role already has; ``get`` it has not)."""
    namespace = str(metadata_of(pod).get("namespace") or "default")
    path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"
    items, _ = await kube.list_all(path)
    return {(namespace, str(metadata_of(t).get("name") or "")): t for t in items}


def _pending(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    status = pod.get("status")
    unbound = not (isinstance(spec, Mapping) and spec.get("nodeName"))
    return unbound and (not isinstance(status, Mapping) or status.get("phase") == "Pending")


async def explain(kube: Kube, pod: Mapping[str, Any]) -> Json | None:
    """Every node's verdict on the pod's claims; None when the pod names no claim of a
    hami DeviceClass (not this mode's pod)."""
    claims, _ = await kube.list_all(f"{RESOURCE_API}/resourceclaims")
    templates = await _templates(kube, pod)
    slices, _ = await kube.list_all(f"{RESOURCE_API}/resourceslices")
    try:
        listed, _ = await kube.list_all("/api/v1/nodes")
        nodes = [str(metadata_of(n).get("name") or "") for n in listed]
    except KubeError as exc:  # the nodes that publish devices still say enough
        _log.warning("nodes not read", error=str(exc))
        nodes = []
    # seconds of pure work on a large cluster: off the loop, so a role's filter and
    # prioritize calls are still answered meanwhile
    answer = await asyncio.to_thread(explainpod.explain_pod, pod, claims, templates, slices, nodes)
    if answer is not None and not answer["error"] and _pending(pod):
        answer["scheduler_message"] = await latest_failed_scheduling(kube, pod)
    return answer
