"""Device health as ``resource.k8s.io`` device taints on the ResourceSlice. Pure.

An unhealthy device stays in the slice with one taint, ``hami.io/unhealthy=<cause>``
(``xid-79``; hami.backends.health) and effect ``NoSchedule``: kube-scheduler's allocator
gives it to no new claim that does not tolerate the taint, while claims already allocated
keep running (``NoExecute`` would have kube-controller-manager evict their pods). A
healthy device has no taint, so recovery is the next slice write.

kube-apiserver drops the taints of a slice without a word when its ``DRADeviceTaints``
gate is off (on by default from 1.36, alpha and off in 1.33-1.35); ``dropped`` tells from
the answer to a write, and the publisher then leaves unhealthy devices out instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami.backends import health
from hami.backends.base import Device

UNHEALTHY_KEY = "hami.io/unhealthy"
EFFECT = "NoSchedule"
JSON = dict[str, Any]


def device_taints(device: Device) -> list[JSON]:
    """The taints of one device: none when healthy, else the unhealthy one naming why."""
    if device.healthy:
        return []
    value = health.label_value(device.unhealthy_reason)
    return [{"key": UNHEALTHY_KEY, "value": value, "effect": EFFECT}]


def _has_taints(device: Any) -> bool:
    return isinstance(device, Mapping) and bool(device.get("taints"))


def dropped(sent: Mapping[str, Any], answer: Mapping[str, Any]) -> bool:
    """True when the slice ``sent`` carried device taints and the API server's ``answer``
    (the object it stored) has none: it does not serve the field."""
    if not any(_has_taints(d) for d in sent.get("devices") or []):
        return False
    spec = answer.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    return not any(_has_taints(d) for d in devices or [])


def _key(taint: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return taint.get("key"), taint.get("value"), taint.get("effect")


def keep_times(devices: Sequence[JSON], existing: Sequence[Any]) -> None:
    """Copy ``timeAdded`` (which the API server stamps) from ``existing`` devices onto the
    same taints of the same devices in ``devices``, so a rewrite for another reason does
    not make an old taint look new."""
    old: dict[tuple[Any, ...], Any] = {}
    for device in existing:
        if not isinstance(device, Mapping):
            continue
        for taint in device.get("taints") or []:
            if isinstance(taint, Mapping) and taint.get("timeAdded"):
                old[(device.get("name"), *_key(taint))] = taint["timeAdded"]
    for device in devices:
        for taint in device.get("taints") or []:
            added = old.get((device.get("name"), *_key(taint)))
            if added is not None:
                taint["timeAdded"] = added


def without_times(device: Mapping[str, Any]) -> JSON:
    """``device`` with its taints' ``timeAdded`` left out (for comparing slices)."""
    out = dict(device)
    taints = out.get("taints")
    if isinstance(taints, list):
        out["taints"] = [
            {k: v for k, v in t.items() if k != "timeAdded"} if isinstance(t, Mapping) else t
            for t in taints
        ]
    return out


def describe(key: str, value: str) -> str | None:
    """What hami's own taint means, for ``hami explain``; None for anyone else's."""
    if key != UNHEALTHY_KEY:
        return None
    xid = health.xid_of(value)
    if xid is not None:
        return f"hami found it unhealthy: critical Xid {xid}"
    return f"hami found it unhealthy: {value}"
