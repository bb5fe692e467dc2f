"""The bind fence's judgement: may this decision still be bound, given everything written?

Pure. The bind path (``hami.scheduler.bind``) writes a pod's decision, waits until its own
pod watch shows that write, and only then asks ``bind_refusal``; the Binding that follows
is conditional on the pod's resourceVersion being the one checked. Watch events come in
resourceVersion order, so by then this replica's picture holds every decision written
before ours, whichever replica (or Go HAMi) wrote it. Two binds on one device can then not
both pass while their sum is over capacity: the later write's check sees the earlier one.

What is counted is the node's whole usage as this replica holds it: bound pods, written
decisions, this replica's own reservations (filter fitted them together with this pod, so
they never refuse a decision made alongside them), plus ``shadows``: decisions written on
pods that this replica has since reserved elsewhere (the written one may still be bound by
another replica). Counting reservations is conservative: a decision that another replica's
write made too big for the device is refused even if one of this replica's own
reservations would later be refused as well; kube-scheduler retries the pod.
"""

from __future__ import annotations

from collections.abc import Iterable

from hami.core import migfit
from hami.core.cluster import Cluster, NodeState
from hami.core.podrecord import PodRecord
from hami.core.usage import DeviceState, Use


def bind_refusal(
    cluster: Cluster,
    key: str,
    record: PodRecord,
    *,
    fit: bool = True,
    shadows: Iterable[PodRecord] = (),
) -> str | None:
    """Why ``record`` (the decision of pod ``key``) must not be bound now; None: bind it.

    With ``fit=False`` only the node and its device types are judged (the checks made
    before the lock and decision writes); the capacity check needs the pod's own write
    seen first."""
    node = cluster.nodes.get(record.node)
    if node is None or not node.exists:
        return f"node {record.node} no longer exists"
    for word in sorted(set(record.types.values())):
        state = node.types.get(word)
        if state is None:
            return f"node {record.node} no longer registers {word} devices"
        if not state.available:
            return f"{word} devices on node {record.node} are unavailable ({state.reason})"
    if not fit:
        return None
    return _over_capacity(cluster, node, key, record, shadows)


def _over_capacity(
    cluster: Cluster, node: NodeState, key: str, record: PodRecord, shadows: Iterable[PodRecord]
) -> str | None:
    own = cluster.pods.get(key)
    # ``usage`` is built from a record's compact hold on each read: read each once
    own_usage = own.usage if own is not None and own.node == node.name else {}
    extra = [s for s in shadows if s.node == node.name and s.key != key]
    extra_usage = [s.usage for s in extra]
    for uuid, mine in sorted(record.usage.items()):
        device = node.devices.get(uuid)
        if device is None:
            return f"device {uuid} is no longer registered on node {node.name}"
        if not device.healthy:
            return f"device {uuid} on node {node.name} is unhealthy"
        if uuid in node.whole_uuids:
            # a pod whose decision cannot be read holds it entirely (Cluster.pod_record)
            return (
                f"device {uuid} on node {node.name} is held whole by a pod whose decision "
                "cannot be read"
            )
        total = Use()
        total.add(node.usage.get(uuid, Use()))
        if uuid in own_usage:
            total.add(own_usage[uuid], -1)  # this pod's hold as the cluster has it
        others = Use(total.slots, total.memory, total.cores)
        for shadow in extra_usage:
            if uuid in shadow:
                others.add(shadow[uuid])
        total = Use(others.slots, others.memory, others.cores)
        total.add(mine)
        if total.slots > device.count:
            return (
                f"device {uuid} on node {node.name} would hold {total.slots} slices "
                f"(split count {device.count})"
            )
        if total.memory > device.total_memory:
            return (
                f"device {uuid} on node {node.name} would hold {total.memory} MiB "
                f"of {device.total_memory} MiB"
            )
        if migfit.is_mig(device):  # slices, not cores (profile cores add up past 100 %)
            why = _mig_refusal(device, node, record, own, extra, others.slots)
            if why is not None:
                return why
        elif device.total_cores > 0 and total.cores > device.total_cores:
            return (
                f"device {uuid} on node {node.name} would hold {total.cores}% cores "
                f"of {device.total_cores}%"
            )
        if others.slots > 0 and _exclusive_on(record, uuid):
            return f"device {uuid} on node {node.name} is no longer free for exclusive use"
    return None


def _mig_refusal(
    device: DeviceState,
    node: NodeState,
    record: PodRecord,
    own: PodRecord | None,
    shadows: list[PodRecord],
    others_slots: int,
) -> str | None:
    uuid = device.uuid

    def slots(pod: PodRecord) -> int:
        use = pod.usage.get(uuid)
        return use.slots if use is not None else 0

    remove = [(own.mig, slots(own))] if own is not None and own.node == node.name else []
    return migfit.fence_refusal(
        device,
        node.mig.get(uuid),
        record.mig.get(uuid, ()),
        remove,
        [(s.mig, slots(s)) for s in shadows],
        others_slots,
    )


def _exclusive_on(record: PodRecord, uuid: str) -> bool:
    """The decision gives some container the whole device's compute (cores >= 100)."""
    return any(
        device.uuid == uuid and device.cores >= 100
        for containers in record.assignment.values()
        for devices in containers
        for device in devices
    )
