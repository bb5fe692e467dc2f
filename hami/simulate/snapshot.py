"""``hami simulate --from-cluster``: a live cluster's Nodes and running pods, read once.

One list of nodes and one of pods through the API server; the pods kept are the bound
ones that have not finished (what holds devices, CPU and memory now). The simulated clock
starts just after the newest heartbeat on the nodes, so every agent that is heartbeating
counts as live.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hami.core.noderesources import FINISHED
from hami.protocol import handshake
from hami.protocol.objects import annotations_of

HEARTBEAT_PREFIX = "hami.io/node-handshake"
# a fresh snapshot should not wait minutes for an API server that is not there
LIST_TIMEOUT = 20.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]  # bound and not finished
    now: datetime  # just after the newest heartbeat


def running(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The pods bound to a node that have not finished."""
    kept: list[dict[str, Any]] = []
    for pod in pods:
        spec, status = pod.get("spec"), pod.get("status")
        node = spec.get("nodeName") if isinstance(spec, Mapping) else None
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if isinstance(node, str) and node and phase not in FINISHED:
            kept.append(dict(pod))
    return kept


def start_time(nodes: Sequence[Mapping[str, Any]], fallback: datetime) -> datetime:
    """One second after the newest ``Reported`` heartbeat on the nodes (``fallback``
    when none carries one)."""
    stamps = [
        stamp
        for node in nodes
        for key, value in annotations_of(node).items()
        if key.startswith(HEARTBEAT_PREFIX)
        and (stamp := handshake.reported_time(value)) is not None
    ]
    return max(stamps) + timedelta(seconds=1) if stamps else fallback


def read(kubeconfig: str | None) -> Snapshot | str:
    """The snapshot, or a message naming what went wrong and the fix."""
    return asyncio.run(_read(kubeconfig))


async def _read(kubeconfig: str | None) -> Snapshot | str:
    from hami.kube.client import open_client
    from hami.kube.kubeconfig import KubeConfigError
    from hami.kube.raw import RetryPolicy

    where = kubeconfig or "the default kubeconfig ($KUBECONFIG, ~/.kube/config or in-cluster)"
    try:
        async with open_client(kubeconfig, RetryPolicy(retries=1)) as kube:
            nodes, _ = await kube.list_all("/api/v1/nodes", request_timeout=LIST_TIMEOUT)
            pods, _ = await kube.list_all("/api/v1/pods", request_timeout=LIST_TIMEOUT)
    except KubeConfigError as exc:
        return f"--from-cluster: {exc}"
    except Exception as exc:  # unreachable, refused, TLS, a bad answer: said, not raised
        return (
            f"--from-cluster: could not list nodes and pods through {where}: {exc}. "
            "Check that the API server is up and reachable, or give --kubeconfig PATH"
        )
    return Snapshot(nodes, running(pods), start_time(nodes, datetime.now(UTC)))
