"""Fields of Kubernetes objects held as plain JSON dicts.

Pure (no I/O, no client import), so ``hami.core`` reads objects through it as well as the
roles, the io shells and the testkit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found: Mapping[str, str] = metadata_of(obj).get("annotations") or {}
    return found


def pod_containers(pod: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], int]:
    """Init containers then app containers (the order of device entries), and how many are
    init containers."""
    spec = pod.get("spec") or {}
    init = list(spec.get("initContainers") or [])
    return init + list(spec.get("containers") or []), len(init)


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name``; a pod sent without a namespace is in ``default``."""
    meta = metadata_of(pod)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
