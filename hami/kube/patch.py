"""Get, list, patch and bind Nodes and Pods as plain JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from hami.kube.raw import (
    DEFAULT_RETRY,
    JSON,
    MERGE_PATCH,
    Conflict,
    KubeError,
    NotFound,
    RetryPolicy,
    list_all,
    request,
)

__all__ = [
    "Conflict",
    "KubeError",
    "NotFound",
    "bind_pod",
    "get_node",
    "get_pod",
    "list_pods",
    "patch_node_annotations",
    "patch_pod_annotations",
]


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


async def get_node(api: client.ApiClient, name: str, *, retry: RetryPolicy = DEFAULT_RETRY) -> JSON:
    return await request(api, "GET", node_path(name), retry=retry)


async def get_pod(
    api: client.ApiClient, namespace: str, name: str, *, retry: RetryPolicy = DEFAULT_RETRY
) -> JSON:
    return await request(api, "GET", pod_path(namespace, name), retry=retry)


async def list_pods(
    api: client.ApiClient,
    *,
    namespace: str | None = None,
    field_selector: str | None = None,
    label_selector: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> list[JSON]:
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    query = [("fieldSelector", field_selector), ("labelSelector", label_selector)]
    items, _version = await list_all(api, path, query=query, retry=retry)
    return items


def _annotation_patch(
    annotations: Mapping[str, str | None], resource_version: str | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"annotations": dict(annotations)}
    if resource_version is not None:
        # A merge patch carrying resourceVersion is rejected with 409 if the object changed.
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


async def patch_node_annotations(
    api: client.ApiClient,
    name: str,
    annotations: Mapping[str, str | None],
    resource_version: str | None = None,
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> JSON:
    """Merge-patch a Node's annotations (None deletes a key); 409 raises Conflict."""
    body = _annotation_patch(annotations, resource_version)
    return await request(
        api, "PATCH", node_path(name), body=body, content_type=MERGE_PATCH, retry=retry
    )


async def patch_pod_annotations(
    api: client.ApiClient,
    namespace: str,
    name: str,
    annotations: Mapping[str, str | None],
    resource_version: str | None = None,
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> JSON:
    """Merge-patch a Pod's annotations (None deletes a key); 409 raises Conflict."""
    body = _annotation_patch(annotations, resource_version)
    return await request(
        api, "PATCH", pod_path(namespace, name), body=body, content_type=MERGE_PATCH, retry=retry
    )


async def bind_pod(
    api: client.ApiClient, namespace: str, name: str, uid: str | None, node: str
) -> None:
    """Create the pod's Binding to ``node`` (what kube-scheduler's default binder does)."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    if uid:
        body["metadata"]["uid"] = uid
    await request(api, "POST", pod_path(namespace, name) + "/binding", body=body)
