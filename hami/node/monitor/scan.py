"""One pass over the containers directories: read each container's region, remove the
directories of pods gone from the node, apply the priority feedback. Blocking file I/O:
run in a worker thread.

Directory names are ``{pod uid}_{container}`` (hami.backends.hamicore); a DRA claim's are
``{pod uid}_claim-{claim}`` or ``{pod uid}_claim-{claim}_{a}+{b}`` per group of requests
(hami.dra.prepare), read the same way: what follows the first ``_`` is the series'
``container`` label. Nothing under a containers directory is trusted: entries are opened
relative to the directory's descriptor without following symlinks, and removal uses
``shutil.rmtree`` with ``dir_fd`` (which does not follow symlinks either).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hami import log
from hami.node.monitor.cachefile import CacheFile, find_cache, open_dir, read_region, write_field
from hami.node.monitor.feedback import FeedbackState, plan_feedback
from hami.node.monitor.pods import PodView
from hami.node.monitor.region import CacheError

_log = log.get(__name__)
# Kubernetes pod UIDs are RFC 4122 UUIDs; only such names are ever removed.
_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True, slots=True)
class Found:
    root: str
    dir_name: str
    pod_uid: str
    container: str
    cache: CacheFile


@dataclass
class ScanResult:
    found: list[Found] = field(default_factory=list)
    uids: set[str] = field(default_factory=set)  # every pod UID a directory names
    unreadable: int = 0
    removed: int = 0
    feedback_writes: int = 0


class Scanner:
    """Keeps what must outlive one pass: when each directory's pod was first seen gone,
    and which file errors were already logged."""

    def __init__(
        self,
        roots: Iterable[str],
        *,
        grace: float,
        feedback: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.roots = list(dict.fromkeys(roots))
        self.grace = grace
        self.feedback = feedback
        self.clock = clock
        self.wall = wall
        self._gone_since: dict[tuple[str, str], float] = {}
        self._logged: dict[tuple[str, str], str] = {}  # (root, dir) -> last error logged
        self._missing_roots: set[str] = set()

    def scan(self, view: PodView) -> ScanResult:
        result = ScanResult()
        seen: set[tuple[str, str]] = set()
        for root in self.roots:
            try:
                # the configured root may itself be a symlink (operator's choice)
                root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                if root not in self._missing_roots:
                    self._missing_roots.add(root)
                    _log.info("monitor.containers_dir_unreadable", path=root, error=exc.strerror)
                continue
            self._missing_roots.discard(root)
            try:
                self._scan_root(root, root_fd, view, result, seen)
                if self.feedback:
                    self._feedback(
                        root, root_fd, [f for f in result.found if f.root == root], result
                    )
            finally:
                os.close(root_fd)
        for key in set(self._gone_since) - seen:
            del self._gone_since[key]
        for key in set(self._logged) - seen:
            del self._logged[key]
        return result

    def _scan_root(
        self,
        root: str,
        root_fd: int,
        view: PodView,
        result: ScanResult,
        seen: set[tuple[str, str]],
    ) -> None:
        with os.scandir(root_fd) as entries:
            names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        for name in sorted(names):
            uid, sep, container = name.partition("_")
            if not sep or not uid or not container:
                continue
            key = (root, name)
            seen.add(key)
            result.uids.add(uid)
            if view.current and uid not in view.pods:
                if self._remove_if_gone(root, root_fd, name, uid, result):
                    continue
            elif uid in view.pods:
                self._gone_since.pop(key, None)
            cache = self._read(root, root_fd, name, result)
            if cache is not None:
                result.found.append(Found(root, name, uid, container, cache))

    def _remove_if_gone(
        self, root: str, root_fd: int, name: str, uid: str, result: ScanResult
    ) -> bool:
        """Remove a gone pod's directory once gone for ``grace`` and unchanged as long."""
        key = (root, name)
        now = self.clock()
        since = self._gone_since.setdefault(key, now)
        if not _UID.match(uid) or now - since < self.grace:
            return False
        try:
            mtime = os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mtime
        except OSError:
            return True
        if self.wall() - mtime < self.grace:
            return False  # written to recently: something still uses it
        try:
            shutil.rmtree(name, dir_fd=root_fd)
        except OSError as exc:
            _log.warning("monitor.cleanup_failed", path=os.path.join(root, name), error=str(exc))
            return False
        _log.info("monitor.removed_gone_pod_dir", path=os.path.join(root, name), pod_uid=uid)
        self._gone_since.pop(key, None)
        result.removed += 1
        return True

    def _read(self, root: str, root_fd: int, name: str, result: ScanResult) -> CacheFile | None:
        path = os.path.join(root, name)
        try:
            dir_fd = open_dir(name, dir_fd=root_fd)
        except OSError as exc:
            self._problem(root, name, path, f"cannot open the directory: {exc.strerror}", result)
            return None
        try:
            cache_name = find_cache(dir_fd)
            if cache_name is None:
                return None  # the container has not started its library yet
            path = os.path.join(path, cache_name)
            cache = read_region(dir_fd, cache_name)
        except (CacheError, OSError) as exc:
            self._problem(root, name, path, str(exc), result)
            return None
        finally:
            os.close(dir_fd)
        if self._logged.pop((root, name), None) is not None:
            _log.info("monitor.region_readable_again", file=path)
        return cache

    def _problem(self, root: str, name: str, path: str, error: str, result: ScanResult) -> None:
        result.unreadable += 1
        if self._logged.get((root, name)) != error:  # once per distinct error, not per pass
            self._logged[(root, name)] = error
            _log.warning("monitor.region_unreadable", file=path, error=error)

    def _feedback(self, root: str, root_fd: int, found: list[Found], result: ScanResult) -> None:
        states = {
            f.dir_name: FeedbackState(
                f.cache.region.priority,
                f.cache.region.recent_kernel,
                f.cache.region.utilization_switch,
                f.cache.region.uuids,
            )
            for f in found
        }
        by_name = {f.dir_name: f for f in found}
        for name, write in plan_feedback(states).items():
            cache = by_name[name].cache
            path = os.path.join(root, name, cache.name)
            try:
                dir_fd = open_dir(name, dir_fd=root_fd)
            except OSError as exc:
                self._feedback_failed(
                    root, name, path, f"cannot open the directory: {exc.strerror}"
                )
                continue
            try:
                for fld, value in (
                    ("recent_kernel", write.recent_kernel),
                    ("utilization_switch", write.utilization_switch),
                ):
                    if value is not None:
                        write_field(dir_fd, cache, fld, value)
                        result.feedback_writes += 1
                        _log.debug("monitor.feedback", file=path, field=fld, value=value)
            except CacheError as exc:
                self._feedback_failed(root, name, path, str(exc))
            finally:
                os.close(dir_fd)

    def _feedback_failed(self, root: str, name: str, path: str, error: str) -> None:
        if self._logged.get((root, name)) != error:  # once per distinct error, not per pass
            self._logged[(root, name)] = error
            _log.warning("monitor.feedback_failed", file=path, error=error)
