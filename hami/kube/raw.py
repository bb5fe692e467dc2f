"""The API server's errors and the one retry policy of ``hami.kube.client.Kube``.

``RetryPolicy``: capped exponential back-off with full jitter, on HTTP 429 (honouring
``Retry-After``), on 5xx answers and on connection errors; requests that may have been
applied already (a POST that reached the server) are not repeated.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
DEFAULT_TIMEOUT = 30.0


def loads(data: bytes | str) -> Any:
    """Decode the API server's JSON. orjson: with the standard library, decoding watch
    events was about two thirds of the scheduler's watch handling (docs/performance.md,
    "Watch handling"). Bad JSON raises ValueError."""
    return orjson.loads(data)


class KubeError(Exception):
    """The API server answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, reason: str, message: str, path: str) -> None:
        super().__init__(f"{path}: {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.path = path
        self.retry_after: float | None = None  # seconds, from a Retry-After header


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """409: a resourceVersion precondition failed, or the object already exists."""


class Gone(KubeError):
    """410: a watch or list resourceVersion is too old."""


STATUS_ERRORS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone}

# Methods whose repetition cannot do anything the first try did not (a merge patch of the
# same annotations, or one guarded by resourceVersion, which then fails with 409).
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "PATCH", "DELETE"})
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class Unreachable(KubeError):
    """No answer from the API server; ``sent`` says whether the request may have arrived."""

    def __init__(self, message: str, path: str, *, sent: bool) -> None:
        super().__init__(0, "Unreachable", message, path)
        self.sent = sent


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Capped exponential back-off with full jitter; ``retries`` extra tries at most.

    Short by default: the callers (an extender call kube-scheduler waits for, kubelet's
    Allocate) have their own deadlines, and the long-lived loops back off on their own.
    """

    retries: int = 4
    base: float = 0.1  # seconds before the first retry, before jitter
    cap: float = 2.0  # no single wait above this
    max_retry_after: float = 5.0  # a server's Retry-After is honoured up to this
    budget: float | None = None  # seconds: no retry starts later than this after the first try

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0 for the first retry)."""
        ceiling = min(self.cap, self.base * 2**attempt)
        wait = random.uniform(0, ceiling)  # full jitter: retries of many clients spread out
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_retry_after))
        return wait


DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(retries=0)
# For work that a caller waits on without a deadline of its own and that must not be lost
# to a short API server outage (kubelet's Allocate has none): retry for up to a minute.
PATIENT_RETRY = RetryPolicy(retries=1_000, base=0.2, cap=5.0, budget=60.0)


def should_retry(method: str, error: KubeError) -> bool:
    """Whether ``error`` is worth another try of the same request."""
    if isinstance(error, Unreachable):
        return method.upper() in _IDEMPOTENT or not error.sent
    if error.status == 429:
        return True  # rejected before any processing
    return error.status in _RETRY_STATUS and method.upper() in _IDEMPOTENT


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare from the API server; the back-off applies
    return seconds if 0 <= seconds < 1e6 else None


async def with_retry(
    method: str,
    attempt: Callable[[], Awaitable[Any]],
    policy: RetryPolicy = DEFAULT_RETRY,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    now: Callable[[], float] | None = None,
) -> Any:
    """Run ``attempt`` until it succeeds, fails for good, or the policy's tries (or time
    budget) run out."""
    clock = now or asyncio.get_running_loop().time
    began = clock()
    tries = 0
    while True:
        try:
            return await attempt()
        except KubeError as exc:
            if tries >= policy.retries or not should_retry(method, exc):
                raise
            wait = policy.delay(tries, exc.retry_after)
            if policy.budget is not None and clock() - began + wait > policy.budget:
                raise
            await sleep(wait)
            tries += 1
