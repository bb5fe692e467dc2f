"""Raw JSON requests through kubernetes_asyncio's authenticated session.

The generated models cost far more to build than the JSON they come from, and the roles
only read a few fields, so everything here speaks plain dicts.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio import client

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
DEFAULT_TIMEOUT = 30.0


class KubeError(Exception):
    """The API server answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, reason: str, message: str, path: str) -> None:
        super().__init__(f"{path}: {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.path = path


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """409: a resourceVersion precondition failed, or the object already exists."""


class Gone(KubeError):
    """410: a watch or list resourceVersion is too old."""


_BY_STATUS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone}


async def request(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    body: Any = None,
    query: Sequence[tuple[str, Any]] = (),
    content_type: str = "application/json",
    request_timeout: float = DEFAULT_TIMEOUT,
) -> JSON:
    """Send one request and return the decoded JSON body; errors raise KubeError."""
    response = await open_stream(
        api,
        method,
        path,
        body=body,
        query=query,
        content_type=content_type,
        request_timeout=request_timeout,
    )
    try:
        data = await response.read()
    finally:
        response.release()
    decoded: JSON = json.loads(data) if data else {}
    return decoded


async def open_stream(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    body: Any = None,
    query: Sequence[tuple[str, Any]] = (),
    content_type: str = "application/json",
    request_timeout: float | aiohttp.ClientTimeout | None = DEFAULT_TIMEOUT,
) -> Any:
    """Start a request and return the aiohttp response, status already checked."""
    headers = {"Accept": "application/json", "Content-Type": content_type}
    try:
        response = await api.call_api(
            path,
            method,
            query_params=[(k, v) for k, v in query if v is not None],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=request_timeout,
        )
    except client.exceptions.ApiException as exc:
        raise KubeError(exc.status or 0, str(exc.reason), str(exc.body or ""), path) from exc
    except (OSError, TimeoutError) as exc:
        raise KubeError(0, "Unreachable", repr(exc), path) from exc
    except Exception as exc:
        # aiohttp's ClientError family: the API server is not reachable right now.
        if type(exc).__module__.startswith("aiohttp"):
            raise KubeError(0, "Unreachable", repr(exc), path) from exc
        raise
    if not 200 <= response.status <= 299:
        try:
            text = (await response.read()).decode("utf-8", "replace")
        finally:
            response.release()
        message = text
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(text).get("message", text)
        error = _BY_STATUS.get(response.status, KubeError)
        raise error(response.status, str(response.reason), message, path)
    return response
