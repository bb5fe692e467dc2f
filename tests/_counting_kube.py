"""A ``Kube`` that records every request it sends, for tests that count API calls."""

from __future__ import annotations

from typing import Any

from hami.kube.client import Kube
from hami.protocol import keys


class CountingKube(Kube):
    """The same session; every request is recorded as (method, path, body)."""

    def __init__(self, kube: Kube) -> None:
        super().__init__(kube.api, kube.retry)
        self.requests: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.requests.append((method, path, kwargs.get("body")))
        return await super().request(method, path, **kwargs)

    def since(self, mark: int) -> list[tuple[str, str]]:
        """(method, path) of the requests after ``mark`` (a length of ``requests``), Events
        left out (they are written in the background, whenever their sender runs)."""
        return [(m, p) for m, p, _ in self.requests[mark:] if "/events" not in p]

    def lock_writes(self, node: str) -> int:
        """Attempts to take ``node``'s lock (conditional PATCHes setting it)."""
        count = 0
        for method, path, body in self.requests:
            if method != "PATCH" or path != f"/api/v1/nodes/{node}":
                continue
            annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
            if annotations.get(keys.NODE_LOCK):
                count += 1
        return count
