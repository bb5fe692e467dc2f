"""The HAMi annotation protocol: pure codecs for what travels on Node and Pod objects."""

from hami.protocol import handshake, keys
from hami.protocol.errors import ProtocolError
from hami.protocol.nodelock import NodeLock, parse_lock
from hami.protocol.poddevices import (
    ContainerDevice,
    PodDevices,
    decode_pod_devices,
    encode_pod_devices,
    entry_containers,
    first_pending_entry,
)
from hami.protocol.register import NodeDevice, decode_node_devices, encode_node_devices

__all__ = [
    "ContainerDevice",
    "NodeDevice",
    "NodeLock",
    "PodDevices",
    "ProtocolError",
    "decode_node_devices",
    "decode_pod_devices",
    "encode_node_devices",
    "encode_pod_devices",
    "entry_containers",
    "first_pending_entry",
    "handshake",
    "keys",
    "parse_lock",
]
