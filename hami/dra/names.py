"""The names the DRA mode uses for one backend on one node. Pure."""

from __future__ import annotations

DRIVER_DOMAIN = "hami.io"
# kubelet 1.36 speaks the DRA service v1 (k8s.io/kubelet pkg/apis/dra/v1 DRAPluginService)
DRA_SERVICE = "v1.DRAPlugin"
PLUGIN_TYPE = "DRAPlugin"  # pluginregistration/v1 constants: the DRA plugin type
CDI_CLASS = "claim"  # CDI kind = {driver}/claim: one CDI device per prepared claim
MIG_PROFILE = "migProfile"  # the attribute only a MIG partition has (hami.dra.migslices)


def driver_name(type_word: str) -> str:
    """``nvidia`` -> ``nvidia.hami.io``: the DRA driver, its DeviceClass and CDI vendor."""
    return f"{type_word.lower()}.{DRIVER_DOMAIN}"


def not_a_partition(driver: str) -> str:
    """CEL that keeps a request off every MIG partition of ``driver``: for claims that ask
    a HAMi-core share (the webhook's), which a partition cannot give."""
    return f'!has(device.attributes["{driver}"].{MIG_PROFILE})'


def device_name(type_word: str, index: int) -> str:
    """One physical device in the slice: ``nvidia-0`` (a DNS label, stable across reboots
    as long as the index is; the uuid is an attribute)."""
    return f"{type_word.lower()}-{index}"


def slice_name(node: str, type_word: str) -> str:
    """The one ResourceSlice of this node and driver."""
    return f"{node}-{type_word.lower()}-{DRIVER_DOMAIN.replace('.', '-')}"


def cdi_kind(driver: str) -> str:
    return f"{driver}/{CDI_CLASS}"


def cdi_device_id(driver: str, claim_uid: str) -> str:
    """``nvidia.hami.io/claim=<claim uid>``: what prepare returns to kubelet."""
    return f"{cdi_kind(driver)}={claim_uid}"


def cdi_spec_file(driver: str, claim_uid: str) -> str:
    """The spec file's name in the CDI directory: one per claim."""
    return f"{driver}-{claim_uid}.json"
