"""Small NVML helpers for the NVIDIA backend: words, paths and error messages.

Pure functions, so the rules HAMi's Go plug-in follows (model prefix, PCI address form,
NUMA fallback) are testable without NVML.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hami.backends.health import APPLICATION_XIDS

# Application errors that say nothing about the GPU itself (hami.backends.health)
DEFAULT_IGNORED_XIDS: frozenset[int] = APPLICATION_XIDS


def text(value: Any) -> str:
    """NVML strings come back as str from nvidia-ml-py, as bytes from older bindings."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def model_name(name: str) -> str:
    """HAMi's model word: ``NVIDIA-`` in front unless the name already starts with it."""
    name = name.strip()
    return name if name.upper().startswith("NVIDIA") else f"NVIDIA-{name}"


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` as sysfs names it: ``0000:07:00.0``, lower case."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if not sep:
        return bus_id
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return bus_id


def numa_node(sysfs_root: str, bus_id: str) -> int:
    """The device's NUMA node; 0 when sysfs has none (-1 on single-node machines)."""
    path = Path(sysfs_root, "bus", "pci", "devices", sysfs_bus_id(bus_id), "numa_node")
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return 0
    return max(value, 0)


def init_error_message(nvml: Any, exc: BaseException) -> str:
    """What to fix when NVML does not start, in the operator's words."""
    if isinstance(exc, _error_class(nvml, "LibraryNotFound")):
        return (
            "NVML library libnvidia-ml.so.1 not found: this node needs the NVIDIA driver "
            "installed, and the container runtime (nvidia-container-toolkit, runtime class "
            "nvidia) mounting libnvidia-ml.so.1 into the hami node agent container"
        )
    if isinstance(exc, _error_class(nvml, "DriverNotLoaded")):
        return "NVML: the NVIDIA kernel driver is not loaded on this node (check nvidia-smi)"
    if isinstance(exc, _error_class(nvml, "NoPermission")):
        return "NVML: no permission to open the GPUs (run the node agent privileged)"
    return f"NVML failed to start: {exc}"


def _error_class(nvml: Any, name: str) -> type[BaseException] | tuple[()]:
    """``nvml.NVMLError_{name}``, or nothing to match when a binding lacks it."""
    found = getattr(nvml, f"NVMLError_{name}", None)
    return found if isinstance(found, type) and issubclass(found, BaseException) else ()


error_class = _error_class  # for the other NVML helper modules


# Link scores between GPUs, as Go HAMi's NVIDIA plugin computes them for the node annotation
# hami.io/node-nvidia-score (topology-aware scheduling): the PCIe path by its common
# ancestor (NVML topology level -> score) plus 100 per NVLink, direct or through NVSwitch.
ANCESTOR_SCORES: dict[int, int] = {
    0: 60,  # NVML_TOPOLOGY_INTERNAL: the same board
    10: 50,  # SINGLE: one PCIe switch
    20: 40,  # MULTIPLE: several PCIe switches
    30: 30,  # HOSTBRIDGE: the same host bridge
    40: 20,  # NODE: the same NUMA node (CPU)
    50: 10,  # SYSTEM: across CPUs
}
NVLINK_SCORE = 100  # per link
MAX_NVLINKS = 18  # Go HAMi knows 1 to 18 links; more reads as unknown
_FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED
_DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH


class GpuLinks:
    """One GPU's NVLinks: the PCI address at the far end of each enabled link, and how
    many of them end at an NVSwitch."""

    def __init__(self, bus_id: str, remotes: list[str], switch_links: int) -> None:
        self.bus_id = bus_id
        self.remotes = remotes
        self.switch_links = switch_links


def read_links(nvml: Any, handle: Any) -> GpuLinks:
    """NVML's view of one GPU's links; links NVML says do not exist are skipped."""
    skip = _error_class(nvml, "NotSupported"), _error_class(nvml, "InvalidArgument")
    skippable = tuple(c for c in skip if isinstance(c, type))
    remotes: list[str] = []
    switches = 0
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", MAX_NVLINKS))):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != _FEATURE_ENABLED:
                continue
        except skippable:
            continue
        with contextlib.suppress(*skippable):
            remotes.append(
                sysfs_bus_id(text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            )
        with contextlib.suppress(*skippable):
            if nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) == _DEVICE_TYPE_SWITCH:
                switches += 1
    bus_id = sysfs_bus_id(text(nvml.nvmlDeviceGetPciInfo(handle).busId))
    return GpuLinks(bus_id, remotes, switches)


def nvlink_score(one: GpuLinks, other: GpuLinks) -> int | None:
    """NVLinks from ``one`` to ``other`` as a score; None: no NVLink known between them."""
    direct = one.remotes.count(other.bus_id)
    if 1 <= direct <= MAX_NVLINKS:
        return NVLINK_SCORE * direct
    if not one.remotes or not (one.switch_links and other.switch_links):
        return None
    through_switch = min(one.switch_links, other.switch_links)
    return NVLINK_SCORE * through_switch if through_switch <= MAX_NVLINKS else None


def link_scores(level: int | None, one: GpuLinks, other: GpuLinks) -> list[int]:
    """The known links from ``one`` to ``other``: its PCIe path, then its NVLinks."""
    found: list[int] = []
    if level in ANCESTOR_SCORES:
        found.append(ANCESTOR_SCORES[level])
    nvlink = nvlink_score(one, other)
    if nvlink is not None:
        found.append(nvlink)
    return found


def pair_score(forward: list[int], backward: list[int]) -> int:
    """A pair's score; links seen from one side only (asymmetric) score 0, as in Go HAMi."""
    return sum(forward) if len(forward) == len(backward) else 0


def common_ancestor(nvml: Any, one: Any, other: Any) -> int | None:
    """NVML's topology level between two GPUs; None when the driver cannot tell."""
    try:
        return int(nvml.nvmlDeviceGetTopologyCommonAncestor(one, other))
    except _error_class(nvml, "NotSupported"):
        return None


def gpu_pair_scores(nvml: Any, handles: Sequence[tuple[str, Any]]) -> dict[tuple[str, str], int]:
    """(uuid, peer uuid) -> score for every ordered pair of the given GPUs. Raises NVMLError."""
    links = {uuid: read_links(nvml, handle) for uuid, handle in handles}
    found: dict[tuple[str, str], list[int]] = {}
    for (a, ha), (b, hb) in itertools.permutations(handles, 2):
        found[(a, b)] = link_scores(common_ancestor(nvml, ha, hb), links[a], links[b])
    return {(a, b): pair_score(found[(a, b)], found[(b, a)]) for a, b in found}
