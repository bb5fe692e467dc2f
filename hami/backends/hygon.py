"""Hygon DCU, scheduler side only, as Go HAMi 2.10 models it (issue 24).

Hygon's node side is HAMi's dcu-vgpu-device-plugin: it writes ``hami.io/node-dcu-register``
in the 7/9-field form and heartbeats ``hami.io/node-handshake-dcu``, and it reads the
scheduler's decision from ``hami.io/dcu-devices-to-allocate`` (vendor word ``DCU``). Pods ask
with ``hygon.com/dcunum`` (devices), ``hygon.com/dcumem`` (MiB: the memory factor of Go's
chart is 1) and ``hygon.com/dcucores`` (percent; absent means the whole device), and steer
with ``hygon.com/use-dcutype`` / ``nouse-dcutype`` and ``hygon.com/use-gpuuuid`` /
``nouse-gpuuuid`` as Go reads them. This project has no node agent for DCU: enabling the
backend in a node agent fails with what to run instead.
"""

from __future__ import annotations

from hami.backends.base import (
    ResourceNames,
)
from hami.backends.schedulerside import SchedulerSideBackend

DCU_RESOURCES = ResourceNames(
    count="hygon.com/dcunum",
    memory="hygon.com/dcumem",
    cores="hygon.com/dcucores",
)


class HygonBackend(SchedulerSideBackend):
    vendor = "Hygon DCU"
    node_plugin = "HAMi's dcu-vgpu-device-plugin"
    plugin_does = "writes hami.io/node-dcu-register"
    type_word = "dcu"
    vendor_word = "DCU"
    default_resources = DCU_RESOURCES
    allocated_key = "hami.io/dcu-devices-allocated"
    to_allocate_key = "hami.io/dcu-devices-to-allocate"
    default_cores = 100  # hygon.com/dcucores absent: the whole device, as Go asks
    known_options = frozenset()
    selector_words = ("dcu", "gpu")
