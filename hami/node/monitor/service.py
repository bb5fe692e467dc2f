"""``UsageMonitor``: the node agent's ``monitor`` task. Every ``scan_period`` it reads the
containers' regions (``scan``), the host's devices (``host``) and the node's pods
(``pods``), and keeps the result as one immutable ``Snapshot`` that ``/metrics`` renders.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hami import log
from hami.node.monitor.host import HostGpu, NvmlHost
from hami.node.monitor.pods import PodRef, PodSource
from hami.node.monitor.region import Region
from hami.node.monitor.scan import Scanner, ScanResult

_log = log.get(__name__)


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    pod: PodRef
    pod_uid: str
    container: str
    region: Region


@dataclass(frozen=True, slots=True)
class Snapshot:
    containers: tuple[ContainerUsage, ...] = ()
    hosts: tuple[HostGpu, ...] = ()
    unreadable: int = 0  # container directories whose region could not be read
    removed_total: int = 0  # gone pods' directories removed since start
    scans: int = 0


class UsageMonitor:
    def __init__(
        self,
        node: str,
        scanner: Scanner,
        pods: PodSource,
        hosts: Sequence[NvmlHost] = (),
        *,
        period: float = 5.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.scanner = scanner
        self.pods = pods
        self.hosts = list(hosts)
        self.period = period
        self.wall = wall
        self.snapshot = Snapshot()
        self.scanned = asyncio.Event()  # set after each completed pass (tests wait on it)
        self._uids: set[str] = set()

    async def run(self) -> None:
        _log.info(
            "monitor.started",
            node=self.node,
            containers_dirs=self.scanner.roots,
            period=self.period,
        )
        while True:
            try:
                await self.scan_once()
            except Exception as exc:  # one bad pass must not end the node agent
                _log.error("monitor.scan_failed", error=repr(exc), exc_info=True)
            await asyncio.sleep(self.period)

    async def scan_once(self) -> Snapshot:
        view = await self.pods.view(self._uids)
        result: ScanResult = await asyncio.to_thread(self.scanner.scan, view)
        hosts: list[HostGpu] = []
        for reader in self.hosts:
            hosts.extend(await asyncio.to_thread(reader.read))
        self._uids = result.uids
        containers = tuple(
            ContainerUsage(view.pods[f.pod_uid], f.pod_uid, f.container, f.cache.region)
            for f in result.found
            if f.pod_uid in view.pods
        )
        previous = self.snapshot
        self.snapshot = Snapshot(
            containers=containers,
            hosts=tuple(hosts),
            unreadable=result.unreadable,
            removed_total=previous.removed_total + result.removed,
            scans=previous.scans + 1,
        )
        self.scanned.set()
        return self.snapshot
