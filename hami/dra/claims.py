"""One ResourceClaim's allocation for this driver and node, read and validated. Pure.

kube-scheduler wrote the allocation, but the claim's status is still input from the API
server: a result naming another node's pool, a device this node does not have, or consumed
capacity beyond the device is refused with a message naming the claim, exactly as the
extender path refuses a forged decision (the same ``check_entry`` rule runs on the result).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.backends.base import Backend, Device
from hami.core.requests import parse_quantity
from hami.dra import names
from hami.protocol import ContainerDevice

MIB = 1 << 20

# hami.node.allocate.check_entry: (devices, backend, node devices, where) -> None, raising
# on a device this node cannot honestly serve. Passed in: hami.dra sits below hami.node.
EntryCheck = Callable[[Sequence[ContainerDevice], Backend, Sequence[Device], str], None]


class ClaimError(ValueError):
    """The claim cannot be prepared here; the message names the claim and the fix."""


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One allocation result of this driver: where kube-scheduler put it and what it took."""

    request: str
    pool: str
    device: str  # the device's name in the slice
    share_id: str | None
    slice: ContainerDevice  # uuid, vendor, MiB, cores: what HAMi-core enforces


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    namespace: str
    name: str
    uid: str
    pod_uid: str  # the pod the claim is reserved for (its HAMi-core directory), else uid
    devices: tuple[ClaimDevice, ...]


def _ref(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"ResourceClaim {meta.get('namespace', '?')}/{meta.get('name', '?')}"


def _mib(value: Any, where: str) -> int:
    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        raise ClaimError(f"{where}: consumed memory {value!r} is not a quantity ({exc})") from None
    if amount % MIB:
        raise ClaimError(f"{where}: consumed memory {value!r} is not a whole number of MiB")
    return amount // MIB


def _cores(value: Any, where: str) -> int:
    try:
        return parse_quantity(value)
    except ValueError as exc:
        raise ClaimError(f"{where}: consumed cores {value!r} is not a number ({exc})") from None


def _pod_uid(claim: Mapping[str, Any], fallback: str) -> str:
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and ref.get("uid"):
            return str(ref["uid"])
    return fallback


def claim_allocation(
    claim: Mapping[str, Any],
    *,
    uid: str,
    node: str,
    backend: Backend,
    node_devices: Sequence[Device],
    check: EntryCheck,
) -> ClaimAllocation:
    """This driver's results of ``claim``, validated against this node's devices. Raises
    ClaimError (or the check's own error) naming the claim."""
    where = _ref(claim)
    meta = claim.get("metadata") or {}
    if meta.get("uid") != uid:
        raise ClaimError(
            f"{where}: uid {meta.get('uid')!r} is not the {uid!r} kubelet asked for "
            "(the claim was deleted and created again); kubelet retries with the new one"
        )
    driver = names.driver_name(backend.type_word)
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"{where}: not allocated; kube-scheduler allocates it before kubelet")
    results = (allocation.get("devices") or {}).get("results") or []
    mine = [r for r in results if isinstance(r, Mapping) and r.get("driver") == driver]
    if not mine:
        raise ClaimError(f"{where}: no allocation result for driver {driver}")
    by_name = {names.device_name(backend.type_word, d.index): d for d in node_devices}
    out: list[ClaimDevice] = []
    for i, result in enumerate(mine):
        at = f"{where} result {i} ({result.get('request', '?')})"
        if result.get("pool") != node:
            raise ClaimError(
                f"{at}: pool {result.get('pool')!r} is not this node's pool {node!r}; "
                "the claim was allocated for another node"
            )
        device = by_name.get(str(result.get("device")))
        if device is None:
            raise ClaimError(
                f"{at}: device {result.get('device')!r} is not a {backend.type_word} device "
                f"of this node (its devices: {', '.join(sorted(by_name)) or 'none'})"
            )
        consumed = result.get("consumedCapacity")
        if not isinstance(consumed, Mapping) or "memory" not in consumed:
            raise ClaimError(
                f"{at}: no consumed memory capacity; the device is shared "
                "(allowMultipleAllocations) and kube-scheduler records what each claim takes"
            )
        cores = _cores(consumed.get("cores", 0), at)
        share = result.get("shareID")
        out.append(
            ClaimDevice(
                request=str(result.get("request", "")),
                pool=node,
                device=str(result["device"]),
                share_id=str(share) if share else None,
                slice=ContainerDevice(
                    uuid=device.uuid,
                    vendor=backend.vendor_word,
                    memory=_mib(consumed["memory"], at),
                    cores=cores,
                ),
            )
        )
    check([d.slice for d in out], backend, node_devices, where)
    return ClaimAllocation(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=uid,
        pod_uid=_pod_uid(claim, uid),
        devices=tuple(out),
    )
