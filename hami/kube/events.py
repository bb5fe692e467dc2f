"""Events on pods, so `kubectl describe pod` shows why hami decided what it did.

``emit_pod_event`` writes one Event now (tools, tests); the scheduler goes through
``hami.kube.recorder.EventRecorder``, which folds repeats and rate-limits per pod.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from hami import log
from hami.kube.client import Kube
from hami.kube.eventfold import ObjectRef
from hami.kube.objects import metadata_of
from hami.kube.raw import JSON, KubeError
from hami.protocol.nodelock import rfc3339

_log = log.get(__name__)
MAX_MESSAGE = 1024  # the API server rejects longer event messages


def ref_of(obj: Mapping[str, Any], kind: str = "Pod") -> ObjectRef:
    """The involved-object reference of ``obj`` (missing fields become empty strings)."""
    meta = metadata_of(obj)
    return ObjectRef(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        kind=kind,
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/events"


def event_body(
    ref: ObjectRef,
    reason: str,
    message: str,
    type_: str,
    component: str,
    *,
    count: int = 1,
    first: datetime | None = None,
    last: datetime | None = None,
) -> JSON:
    """A core/v1 Event about ``ref`` with a fresh unique name."""
    first = first or datetime.now(UTC)
    involved: JSON = {
        "apiVersion": "v1",
        "kind": ref.kind,
        "name": ref.name,
        "namespace": ref.namespace,
    }
    if ref.uid:
        involved["uid"] = ref.uid
    if ref.resource_version:
        involved["resourceVersion"] = ref.resource_version
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{ref.name or 'pod'}.{uuid.uuid4().hex[:16]}",
            "namespace": ref.namespace,
        },
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": type_,
        "source": {"component": component},
        "firstTimestamp": rfc3339(first),
        "lastTimestamp": rfc3339(last or first),
        "count": count,
        "reportingComponent": component,
    }


async def emit_pod_event(
    kube: Kube,
    pod: Mapping[str, Any],
    reason: str,
    message: str,
    type_: str = "Normal",
    component: str = "hami-scheduler",
) -> bool:
    """Create a core/v1 Event for ``pod``; failures are logged, never raised."""
    ref = ref_of(pod)
    body = event_body(ref, reason, message, type_, component)
    try:
        await kube.create(events_path(ref.namespace), body)
    except KubeError as exc:
        _log.warning(
            "event not recorded",
            pod=f"{ref.namespace}/{ref.name}",
            reason=reason,
            error=str(exc),
        )
        return False
    return True
