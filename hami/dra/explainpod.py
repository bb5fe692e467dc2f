"""``hami explain``'s answer for a pod waiting on DRA claims, from the objects as read.
Pure: the caller reads them from the API server (``hami.scheduler.draexplain``).

The pod's claims (``claimasks``), each node's devices and what allocated claims hold
(``devicepicture``) and the verdict per node (``whynot``), put together as the JSON
answer ``hami explain`` prints: per node ``fits`` or the reasons joined, the reasons as a
list under ``details``, what hami does not judge under ``notes``, and every object it
could not read under ``object_errors``, each naming the object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hami.core.requests import RequestError
from hami.dra import claimasks, devicepicture, names, podrequest, whynot

Json = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)


def _key(obj: Any) -> Key:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def hami_drivers(slices: Iterable[Any]) -> dict[str, str]:
    """driver -> type word, for every hami driver (``{type}.hami.io``) with a slice."""
    suffix = "." + names.DRIVER_DOMAIN
    out: dict[str, str] = {}
    for obj in slices:
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        driver = spec.get("driver") if isinstance(spec, Mapping) else None
        if isinstance(driver, str) and driver.endswith(suffix) and driver != suffix[1:]:
            out[driver] = driver.removesuffix(suffix)
    return out


def _pod_ref(pod: Mapping[str, Any]) -> str:
    namespace, name = _key(pod)
    return f"{namespace or 'default'}/{name or '?'}"


def explain_pod(
    pod: Mapping[str, Any],
    claims: Sequence[Any],
    templates: Mapping[Key, Any],
    slices: Sequence[Any],
    nodes: Iterable[str] = (),
) -> Json | None:
    """Every node's verdict on ``pod``'s claims; None when it names no claim of a hami
    DeviceClass. ``claims``: every ResourceClaim (allocated ones hold devices);
    ``templates``: (namespace, name) -> the templates the pod names; ``nodes``: every
    node's name (nodes without hami devices are judged too)."""
    key = _pod_ref(pod)
    index = {_key(c): c for c in claims if isinstance(c, Mapping)}
    try:
        asks = claimasks.pod_asks(
            pod, lambda ns, n: index.get((ns, n)), lambda ns, n: templates.get((ns, n))
        )
    except podrequest.UnknownClaim as exc:
        text = str(exc).replace("is not known yet", "does not exist")
        return {"pod": key, "mode": "dra", "error": text, "nodes": {}}
    except RequestError as exc:
        return {"pod": key, "mode": "dra", "error": str(exc), "nodes": {}}
    if not (asks.wanted or asks.pinned or asks.errors):
        return None
    drivers = hami_drivers(slices)
    seen = devicepicture.picture((s for s in slices if isinstance(s, Mapping)), drivers)
    held, hold_errors = devicepicture.holds(
        index.values(), drivers, pools=seen.pools, partitions=seen.partitions
    )
    every = {n for n in nodes if n} | set(seen.devices) | set(seen.partitions)
    every |= {p.node for p in asks.pinned}
    verdicts: dict[str, whynot.Verdict] = {}
    for node in sorted(every):
        devices = seen.devices.get(node, ())
        mine = held.get(node, {})
        parts = seen.partitions.get(node, ())
        verdicts[node] = whynot.judge_node(node, asks.wanted, devices, mine, asks.pinned, parts)
    spec = pod.get("spec")
    assigned = spec.get("nodeName") if isinstance(spec, Mapping) else None
    unreadable = not asks.wanted and not asks.pinned
    return {
        "pod": key,
        "mode": "dra",
        "error": "; ".join(asks.errors) if unreadable else "",
        "assigned": str(assigned or ""),
        "requests": [w.label for w in asks.wanted],
        "allocated": [
            {"claim": p.claim, "node": p.node, "devices": list(p.devices)} for p in asks.pinned
        ],
        "nodes": {n: "fits" if v.fits else "; ".join(v.lines) for n, v in verdicts.items()},
        "details": {n: list(v.lines) for n, v in verdicts.items()},
        "notes": list(asks.notes),
        "object_errors": [*asks.errors, *seen.errors, *hold_errors],
    }
