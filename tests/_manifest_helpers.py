"""Reading docker/manifests and applying them to the test control plane."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hami.kube.client import Kube

MANIFESTS = Path(__file__).resolve().parents[1] / "docker" / "manifests"
APPLY_PATCH = "application/apply-patch+yaml"
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "RuntimeClass",
}


def documents(pattern: str = "*.yaml") -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(MANIFESTS.glob(pattern)):
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def collection_path(doc: dict[str, Any]) -> str:
    group_version = doc["apiVersion"]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    kind = doc["kind"].lower()
    if kind.endswith("y"):
        plural = kind[:-1] + "ies"
    else:
        plural = kind + ("es" if kind.endswith("s") else "s")
    if doc["kind"] in CLUSTER_SCOPED:
        return f"{base}/{plural}"
    return f"{base}/namespaces/{doc['metadata']['namespace']}/{plural}"


def object_path(doc: dict[str, Any]) -> str:
    return f"{collection_path(doc)}/{doc['metadata']['name']}"


async def apply(kube: Kube, doc: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """Server-side apply, as `kubectl apply --server-side [--dry-run=server]` does, with
    strict field validation."""
    query = [("fieldValidation", "Strict"), ("fieldManager", "hami-test"), ("force", "true")]
    if dry_run:
        query.append(("dryRun", "All"))
    applied: dict[str, Any] = await kube.request(
        "PATCH", object_path(doc), body=doc, query=query, content_type=APPLY_PATCH
    )
    return applied
