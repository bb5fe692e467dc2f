"""The NVML health event loop; runs in a worker thread, never on the event loop.

It follows the NVIDIA device plugin: register Xid critical error events on every device,
wait on the event set with a timeout (so a stop request is seen within ``timeout_ms``),
and mark a device unhealthy on a critical Xid that is not an application error. When the
device behind an event cannot be told, every device is marked unhealthy: it is safer to
stop scheduling on a node than onto a broken GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from hami.backends import health
from hami.backends._nvml import text
from hami.backends.base import Device

log = structlog.get_logger(__name__)

MarkUnhealthy = Callable[[str, str, str], None]
"""Called with (uuid, reason, cause) for a device found unhealthy: the reason for the log,
the cause as one word (``xid-79``, hami.backends.health) for the device."""


def watch_events(
    nvml: Any,
    devices: Sequence[Device],
    *,
    ignored_xids: frozenset[int],
    timeout_ms: int,
    stop: threading.Event,
    mark_unhealthy: MarkUnhealthy,
) -> None:
    uuids = [d.uuid for d in devices]
    xid_event = int(nvml.nvmlEventTypeXidCriticalError)
    event_set = nvml.nvmlEventSetCreate()
    try:
        for uuid in uuids:
            _register(nvml, event_set, uuid, xid_event, mark_unhealthy)
        while not stop.is_set():
            try:
                event = nvml.nvmlEventSetWait(event_set, timeout_ms)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as exc:
                for uuid in uuids:
                    mark_unhealthy(
                        uuid, f"waiting for NVML events failed: {exc}", health.HEALTH_WATCH_FAILED
                    )
                stop.wait(timeout_ms / 1000)  # a lasting failure must not spin
                continue
            _handle(nvml, event, uuids, xid_event, ignored_xids, mark_unhealthy)
    finally:
        try:
            nvml.nvmlEventSetFree(event_set)
        except nvml.NVMLError as exc:
            log.warning("nvidia.event_set_free_failed", error=str(exc))


def _register(
    nvml: Any, event_set: Any, uuid: str, xid_event: int, mark_unhealthy: MarkUnhealthy
) -> None:
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
        if not supported & xid_event:
            # Too old to report Xids: no health source, but not a reason to stop using it.
            log.warning("nvidia.health_not_supported", uuid=uuid)
            return
        nvml.nvmlDeviceRegisterEvents(handle, xid_event, event_set)
    except nvml.NVMLError_NotSupported:
        log.warning("nvidia.health_not_supported", uuid=uuid)
    except nvml.NVMLError as exc:
        mark_unhealthy(uuid, f"cannot watch its health events: {exc}", health.HEALTH_WATCH_FAILED)


def _handle(
    nvml: Any,
    event: Any,
    uuids: Sequence[str],
    xid_event: int,
    ignored_xids: frozenset[int],
    mark_unhealthy: MarkUnhealthy,
) -> None:
    if int(event.eventType) != xid_event:
        return
    xid = int(event.eventData)
    if not health.is_fatal(xid, ignored_xids):
        log.info("nvidia.xid_ignored", xid=xid)
        return
    reason, cause = f"Xid {xid} critical error", health.xid_cause(xid)
    uuid = _event_uuid(nvml, event)
    if uuid is None:
        for each in uuids:
            mark_unhealthy(each, f"{reason} on an unidentified device", cause)
    elif uuid in uuids:
        mark_unhealthy(uuid, reason, cause)
    else:
        log.info("nvidia.xid_other_device", xid=xid, uuid=uuid)


def _event_uuid(nvml: Any, event: Any) -> str | None:
    """The uuid of the event's device; None when NVML cannot say (a null handle)."""
    if not event.device:
        return None
    try:
        return text(nvml.nvmlDeviceGetUUID(event.device))
    except nvml.NVMLError:
        return None
