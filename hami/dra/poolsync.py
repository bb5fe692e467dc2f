"""Writes a pool of several ResourceSlices (MIG partitions: ``hami.dra.migslices``) to the
API server: reads every slice the pool has or had, then creates, replaces and deletes what
``plan_pool`` says, so the pool moves to its next generation whole."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from hami.backends.base import Backend, Device
from hami.dra import migslices

JSON = dict[str, Any]
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class PoolKube(Protocol):
    async def request(self, method: str, path: str, *, body: Any = None) -> JSON: ...


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


async def _get(kube: PoolKube, name: str) -> JSON | None:
    try:
        return await kube.request("GET", f"{SLICES_PATH}/{name}")
    except Exception as exc:
        if _status(exc) == 404:
            return None
        raise


async def delete_slice(kube: PoolKube, name: str) -> None:
    try:
        await kube.request("DELETE", f"{SLICES_PATH}/{name}")
    except Exception as exc:
        if _status(exc) != 404:
            raise


async def sync_pool(
    kube: PoolKube,
    node: str,
    backend: Backend,
    devices: Sequence[Device],
    known: set[str],
) -> tuple[migslices.PoolPlan, set[str]]:
    """Make the pool's slices say what ``devices`` say. ``known``: names written before
    (so a slice no longer needed is deleted). Returns the plan carried out and the names
    the pool has now. A 409 (a write between the read and ours) propagates: the caller
    tries again."""
    desired = {b["metadata"]["name"] for b in migslices.pool_slices(node, backend, devices)}
    existing = {name: await _get(kube, name) for name in sorted(known | desired)}
    plan = migslices.plan_pool(node, backend, devices, existing)
    for body in plan.create:
        await kube.request("POST", SLICES_PATH, body=body)
    for body in plan.replace:
        await kube.request("PUT", f"{SLICES_PATH}/{body['metadata']['name']}", body=body)
    for name in plan.delete:
        await delete_slice(kube, name)
    return plan, desired
