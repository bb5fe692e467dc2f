"""List+watch of one kind of object, feeding a handler with plain JSON events.

The handler sees only ``ADDED``, ``MODIFIED`` and ``DELETED``. After a (re-)list the
reflector diffs the listed objects against what it reported before, so objects deleted
while the watch was down are reported as ``DELETED`` and unchanged ones are not repeated.
The list is paged (``limit``/``continue``) and each page is handed over as it arrives; 410
Gone (an expired watch or continue token) re-lists from the start; any other failure
reconnects with capped exponential back-off. Deletions found by a list are reported only
once the whole list is in, so a list that fails part-way deletes nothing.

A handler that raises is logged with the object's key and the stream goes on: one bad
object must not end the watch. ``down_for()`` says how long the stream has been broken
(0 while a watch is open), so a role can stop claiming readiness on a frozen picture.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from hami import log
from hami.kube.client import PAGE_SIZE, Kube
from hami.kube.objects import metadata_of
from hami.kube.raw import JSON, Gone, KubeError

Handler = Callable[[str, JSON], None]
WATCH_SECONDS = 300
# Objects a list hands over between yields to the event loop: a whole page of 500 pods
# held the loop (and the scheduler's /filter) for 20-40 ms on a loaded 2-core machine.
HAND_OVER_BATCH = 100


def object_key(obj: JSON) -> str:
    meta = metadata_of(obj)
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


class Reflector:
    def __init__(
        self,
        kube: Kube,
        path: str,
        handler: Handler,
        *,
        name: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        max_backoff: float = 30.0,
        page_size: int = PAGE_SIZE,
        clock: Callable[[], float] = time.monotonic,
        after_initial_page: Callable[[], None] | None = None,
        after_list: Callable[[], None] | None = None,
    ) -> None:
        self.kube = kube
        self.path = path  # e.g. /api/v1/pods, /api/v1/nodes
        self.handler = handler
        self.name = name
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.max_backoff = max_backoff
        self.page_size = page_size
        self.synced = asyncio.Event()
        self.resource_version = ""
        self._known: dict[str, str] = {}  # key -> resourceVersion last reported
        self._clock = clock
        # Called after each page of the lists before the first complete one, the page
        # already dropped: the scheduler freezes the state built so far there.
        self.after_initial_page = after_initial_page
        # Called after every complete list: the changes between the watch's last event and
        # the list's snapshot were folded into one (the node locks' history restarts).
        self.after_list = after_list
        # When the stream last broke; None while a watch is open (or before any failure).
        self._broken_since: float | None = None
        self._log = log.get(__name__).bind(reflector=name)

    async def run(self) -> None:
        """Run until cancelled."""
        backoff = 0.5
        announced = False
        while True:
            try:
                await self._list()
                if not announced:
                    self._log.info("watching", path=self.path, objects=len(self._known))
                    announced = True
                backoff = 0.5
                while True:
                    await self._watch()
            except Gone:
                self._log.debug("resource version expired, re-listing")
                continue
            except KubeError as exc:
                self._broke()
                self._log.warning("list/watch failed, retrying", error=str(exc), retry_in=backoff)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                self._broke()
                self._log.warning("watch stream broke, retrying", error=repr(exc), retry_in=backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff)

    @property
    def streaming(self) -> bool:
        """Whether the picture is current: listed, and no failure since the last watch opened."""
        return self.synced.is_set() and self._broken_since is None

    def down_for(self) -> float:
        """Seconds since the stream broke without a watch opening again; 0 while streaming."""
        if self._broken_since is None:
            return 0.0
        return max(0.0, self._clock() - self._broken_since)

    def _broke(self) -> None:
        if self._broken_since is None:
            self._broken_since = self._clock()

    def _selectors(self) -> list[tuple[str, Any]]:
        return [("fieldSelector", self.field_selector), ("labelSelector", self.label_selector)]

    async def _list(self) -> None:
        """Hand each page over as it arrives, then report what the list no longer has.

        Holding the whole list first kept millions of short-lived JSON objects alive at
        65,000 nodes, and CPython's full collections walked them all (0.8 s CPU passes
        during a relist). Pages handed over early are no harm if the list then fails:
        each object is the server's, newer than or equal to what was reported, and the
        deletions wait for a complete list (a 410 on ``continue`` raises Gone; ``run``
        lists again from the start with a fresh ``seen``)."""
        seen: set[str] = set()
        version = ""
        async for page in self.kube.list_pages(
            self.path, query=self._selectors(), page_size=self.page_size
        ):
            version = page.resource_version
            items = page.items
            del page
            for start in range(0, len(items), HAND_OVER_BATCH):
                if start:  # let /filter and the other watches in between batches
                    await asyncio.sleep(0)
                self._listed(items[start : start + HAND_OVER_BATCH], seen)
            del items  # dropped before the hook, so a freeze there does not keep it
            if self.after_initial_page is not None and not self.synced.is_set():
                self.after_initial_page()
        for key in [key for key in self._known if key not in seen]:
            namespace, _, name = key.rpartition("/")
            meta: dict[str, Any] = {"name": name}
            if namespace:
                meta["namespace"] = namespace
            self._deliver("DELETED", {"metadata": meta})
        self.resource_version = version
        if self.after_list is not None:
            self.after_list()
        self.synced.set()

    def _listed(self, items: list[JSON], seen: set[str]) -> None:
        """Report a page's new and changed objects (in a frame of its own: no loop
        variable outlives the page)."""
        for obj in items:
            key = object_key(obj)
            seen.add(key)
            version = str(metadata_of(obj).get("resourceVersion", ""))
            previous = self._known.get(key)
            if previous != version:
                self._deliver("ADDED" if previous is None else "MODIFIED", obj)

    async def _watch(self) -> None:
        query = [
            *self._selectors(),
            ("watch", "true"),
            ("resourceVersion", self.resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", WATCH_SECONDS),
        ]
        timeout = aiohttp.ClientTimeout(sock_connect=10, sock_read=WATCH_SECONDS + 30)
        async with self.kube.stream(self.path, query=query, request_timeout=timeout) as events:
            self._broken_since = None  # a list and an open watch: the picture is current again
            async for event in events:
                self._on_event(event)

    def _on_event(self, event: JSON) -> None:
        kind = event.get("type")
        obj: JSON = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code", 0)
            if code == 410:
                raise Gone(410, "Gone", str(obj.get("message", "")), self.path)
            raise KubeError(
                int(code or 0), str(obj.get("reason", "")), str(obj.get("message")), self.path
            )
        version = metadata_of(obj).get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._deliver(kind, obj)

    def _deliver(self, kind: str, obj: JSON) -> None:
        key = object_key(obj)
        if kind == "DELETED":
            self._known.pop(key, None)
        else:
            self._known[key] = str(metadata_of(obj).get("resourceVersion", ""))
        try:
            self.handler(kind, obj)
        except Exception:  # one bad object must not stop the stream
            # (never event=: it is structlog's message argument, and the TypeError it
            # raises here used to end the reflector task for good)
            self._log.exception("handler failed; skipped this object", kind=kind, object=key)
