"""Which mode a device pod's namespace runs in: the extender's or DRA's. Pure.

Both modes can serve one API server (docs/dra.md "Both modes on one cluster"): the
namespace label ``hami.io/device-mode`` (``extender`` or ``dra``) decides for the pods
created in it, and namespaces without it get ``scheduler.webhook.device_mode``. A
namespace is the unit because it is what a team owns and what an administrator labels:
a Deployment's pods never change mode between replicas, and no pod can pick a mode its
namespace does not allow.
"""

from __future__ import annotations

from collections.abc import Mapping

MODE_LABEL = "hami.io/device-mode"
EXTENDER = "extender"
DRA = "dra"
DEVICE_MODES = (EXTENDER, DRA)


class DeviceModeError(ValueError):
    """The namespace's label names no mode; the message names the namespace and the fix."""


def mode_of(namespace: str, labels: Mapping[str, str], default: str) -> str:
    """The namespace's mode: its label, else ``default``."""
    value = labels.get(MODE_LABEL)
    if value is None:
        return default
    if value not in DEVICE_MODES:
        raise DeviceModeError(
            f"namespace {namespace} has {MODE_LABEL}={value[:64]!r}; label it "
            f"{MODE_LABEL}=extender or {MODE_LABEL}=dra, or remove the label for the "
            f"cluster's default ({default})"
        )
    return value
