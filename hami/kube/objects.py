"""Deprecated location: the object field readers live in ``hami.protocol.objects``."""

from hami.protocol.objects import annotations_of, metadata_of, pod_containers, pod_key

__all__ = ["annotations_of", "metadata_of", "pod_containers", "pod_key"]
