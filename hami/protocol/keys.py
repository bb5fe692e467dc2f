"""Annotation keys shared by every HAMi component (protocol.md sections 1-5)."""

from __future__ import annotations

import enum
import functools

PREFIX = "hami.io/"

# Pod, written by the scheduler.
VGPU_NODE = "hami.io/vgpu-node"
VGPU_TIME = "hami.io/vgpu-time"
BIND_TIME = "hami.io/bind-time"
BIND_PHASE = "hami.io/bind-phase"
# NVIDIA dynamic MIG: the scheduler's reservation, completed by the node (protocol.md §10).
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"

# Pod, optional steering by users.
NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
DEVICE_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"

# Node, the lock between bind and allocation.
NODE_LOCK = "hami.io/mutex.lock"


class BindPhase(enum.StrEnum):
    ALLOCATING = "allocating"
    SUCCESS = "success"
    FAILED = "failed"


def node_register(type_word: str) -> str:
    return f"hami.io/node-{type_word}-register"


def node_handshake(type_word: str) -> str:
    return f"hami.io/node-handshake-{type_word}"


# Go HAMi's NVIDIA plugin and scheduler (since v2.4) use this key without the type suffix;
# NVIDIA writes and reads its heartbeat under both (protocol.md §1, §2).
NVIDIA_HANDSHAKE = "hami.io/node-handshake"


@functools.lru_cache(maxsize=64)  # one tuple per type: each node's heartbeat map shares its keys
def handshake_keys(type_word: str) -> tuple[str, ...]:
    """Every key a type's heartbeat is written to and read from, this project's first."""
    if type_word == "nvidia":
        return (node_handshake(type_word), NVIDIA_HANDSHAKE)
    return (node_handshake(type_word),)
