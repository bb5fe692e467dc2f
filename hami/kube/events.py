"""Events on pods, so `kubectl describe pod` shows why hami decided what it did."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from hami import log
from hami.kube.client import Kube
from hami.kube.objects import metadata_of
from hami.kube.raw import KubeError
from hami.protocol.nodelock import rfc3339

_log = log.get(__name__)
MAX_MESSAGE = 1024  # the API server rejects longer event messages


async def emit_pod_event(
    kube: Kube,
    pod: Mapping[str, Any],
    reason: str,
    message: str,
    type_: str = "Normal",
    component: str = "hami-scheduler",
) -> bool:
    """Create a core/v1 Event for ``pod``; failures are logged, never raised."""
    meta = metadata_of(pod)
    namespace = meta.get("namespace", "default")
    now = rfc3339(datetime.now(UTC))
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta.get('name', 'pod')}.{uuid.uuid4().hex[:16]}",
            "namespace": namespace,
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name"),
            "namespace": namespace,
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": type_,
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": component,
    }
    try:
        await kube.create(f"/api/v1/namespaces/{namespace}/events", body)
    except KubeError as exc:
        _log.warning(
            "event not recorded",
            pod=f"{namespace}/{meta.get('name')}",
            reason=reason,
            error=str(exc),
        )
        return False
    return True
