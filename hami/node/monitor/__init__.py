"""The per-container usage monitor of the node role (docs/node.md "Usage monitor").

HAMi-core (``libvgpu.so`` in each container) keeps its usage in a shared-region file under
``{containers dir}/{pod uid}_{container}/``; this package reads those files (``region``,
``cachefile``), names them by pod (``pods``), adds host-level usage from NVML (``host``),
removes gone pods' directories and applies HAMi's priority feedback (``scan``,
``feedback``), and keeps the result for ``/metrics`` (``service``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hami import config, log
from hami.backends.base import Backend
from hami.backends.hamicore import HamiCorePaths
from hami.node.metrics import NodeMetrics
from hami.node.monitor.host import host_readers
from hami.node.monitor.pods import CachePods, ListedPods, PodLister, PodSource
from hami.node.monitor.scan import Scanner
from hami.node.monitor.service import Snapshot, UsageMonitor

__all__ = ["Snapshot", "UsageMonitor", "containers_dirs", "create"]
_log = log.get(__name__)


def containers_dirs(cfg: config.MonitorConfig, backends: Iterable[Backend]) -> list[str]:
    """The configured directory, else every HAMi-core backend's (what Allocate mounts)."""
    if cfg.containers_dir:
        return [cfg.containers_dir]
    dirs = []
    for backend in backends:
        paths = getattr(backend, "paths", None)
        if isinstance(paths, HamiCorePaths) and paths.containers_dir not in dirs:
            dirs.append(paths.containers_dir)
    return dirs


def create(
    cfg: config.MonitorConfig,
    node: str,
    kube: PodLister,
    backends: Iterable[Backend],
    metrics: NodeMetrics,
    cache: Any = None,
) -> UsageMonitor | None:
    """The node agent's monitor, its series added to ``metrics``; None when disabled or no
    backend uses HAMi-core. ``cache``: the agent's pod watch (``NodeCache``), if it runs."""
    if not cfg.enabled:
        return None
    backends = list(backends)
    roots = containers_dirs(cfg, backends)
    if not roots:
        _log.info("monitor.not_started", node=node, reason="no backend uses HAMi-core")
        return None
    period = cfg.scan_period.seconds
    pods: PodSource = (
        CachePods(cache)
        if cache is not None
        else ListedPods(kube, node, resync=max(60.0, period), min_interval=period)
    )
    scanner = Scanner(roots, grace=cfg.cleanup_grace.seconds, feedback=cfg.feedback)
    monitor = UsageMonitor(node, scanner, pods, host_readers(backends), period=period)
    metrics.add_usage(node, lambda: monitor.snapshot)
    return monitor
