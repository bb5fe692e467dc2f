"""Devices read from a Node's kubelet capacity, as Go HAMi 2.10 reads the vendors whose
device plugins advertise slices of each card rather than writing a register value.

Pure helpers for the backends' ``devices_from_node``: the Node is the API object as a dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami.core.requests import parse_quantity
from hami.protocol import ProtocolError
from hami.protocol.objects import metadata_of

_WHAT = "node capacity"


def capacity_of(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """``status.capacity`` of a Node; {} when absent or not a map."""
    status = node.get("status")
    capacity = status.get("capacity") if isinstance(status, Mapping) else None
    return capacity if isinstance(capacity, Mapping) else {}


def node_name(node: Mapping[str, Any]) -> str:
    return str(metadata_of(node).get("name") or "")


def whole_quantity(value: Any, resource: str) -> int:
    """A capacity quantity that must be a whole number (Go's ``AsInt64``); else
    ProtocolError naming the resource."""
    if isinstance(value, bool) or not isinstance(value, str | int) or len(str(value)) > 64:
        raise ProtocolError(_WHAT, f"{resource} is not a quantity", repr(value)[:100])
    try:
        return parse_quantity(value)
    except (ValueError, ArithmeticError):
        raise ProtocolError(_WHAT, f"{resource} is not a whole number", str(value)) from None


def advertised(node: Mapping[str, Any], resource: str) -> int | None:
    """How many of ``resource`` the Node's capacity advertises; None when it names none
    or not more than 0 (the capacity readers' common start)."""
    capacity = capacity_of(node)
    if resource not in capacity:
        return None
    count = whole_quantity(capacity[resource], resource)
    return count if count > 0 else None
