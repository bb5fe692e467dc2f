"""The node role: registration heartbeat, kubelet device plugins, Allocate from annotations."""

from hami.node.agent import NodeAgent

__all__ = ["NodeAgent"]
