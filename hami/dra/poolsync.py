"""Writes a pool of several ResourceSlices (MIG partitions: ``hami.dra.migslices``) to the
API server: reads every slice the pool has or had, then creates, replaces and deletes what
``plan_pool`` says, so the pool moves to its next generation whole."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from hami.backends.base import Backend, Device
from hami.dra import migslices, taints

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
    *,
    with_taints: bool = True,
) -> tuple[migslices.PoolPlan, set[str], bool]:
    """Make the pool's slices say what ``devices`` say. ``known``: names written before
    (so a slice no longer needed is deleted). Returns the plan carried out, the names the
    pool has now, and whether the API server dropped the device taints it was sent (it
    does not serve them: ``hami.dra.taints.dropped``). A 409 (a write between the read and
    ours) propagates: the caller tries again."""
    bodies = migslices.pool_slices(node, backend, devices, with_taints=with_taints)
    desired = {b["metadata"]["name"] for b in bodies}
    existing = {name: await _get(kube, name) for name in sorted(known | desired)}
    plan = migslices.plan_pool(node, backend, devices, existing, with_taints=with_taints)
    dropped = False
    for body in plan.create:
        stored = await kube.request("POST", SLICES_PATH, body=body)
        dropped = dropped or taints.dropped(body["spec"], stored)
    for body in plan.replace:
        path = f"{SLICES_PATH}/{body['metadata']['name']}"
        stored = await kube.request("PUT", path, body=body)
        dropped = dropped or taints.dropped(body["spec"], stored)
    for name in plan.delete:
        await delete_slice(kube, name)
    return plan, desired, dropped
