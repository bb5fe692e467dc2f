"""Fields of Kubernetes objects held as plain JSON dicts.

Pure (no I/O, no client import), so ``hami.core`` reads objects through it as well as the
roles and the testkit.
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


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name``; a pod sent without a namespace is in ``default``."""
    meta = metadata_of(pod)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
