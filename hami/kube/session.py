"""The authenticated HTTP session to the API server under ``hami.kube.client.Kube``.

What kubernetes_asyncio's ``ApiClient.call_api`` did for ``Kube`` (the same request on the
wire: URL-encoded query, JSON body, bearer or Basic ``Authorization``, client certificate,
proxy, ``tls-server-name``), without importing its generated client package. ``call_api``
keeps its keyword names, so ``Kube`` runs on either (tests still hand it kubernetes_asyncio's
``ApiClient``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

import aiohttp
import orjson

from hami import __version__
from hami.kube.kubeconfig import ClusterConfig

# Watch events of large objects exceed aiohttp's default read buffer; etcd's default
# request limit is 1.5 MiB (the value kubernetes_asyncio uses).
READ_BUFSIZE = 2**21
POOL_SIZE = 100  # connections to the API server at once (kubernetes_asyncio's default)
_BODYLESS = frozenset({"GET", "HEAD"})


def client_timeout(value: Any) -> aiohttp.ClientTimeout:
    """A number: the total; a pair: (connect, read); a ClientTimeout as is; None: none."""
    if isinstance(value, aiohttp.ClientTimeout):
        return value
    if isinstance(value, int | float) and value:
        return aiohttp.ClientTimeout(total=value)
    if isinstance(value, tuple) and len(value) == 2:
        return aiohttp.ClientTimeout(connect=value[0], sock_connect=value[0], sock_read=value[1])
    return aiohttp.ClientTimeout()


class ApiSession:
    """One aiohttp session with the configuration's TLS, proxy and credentials.

    ``configuration``, ``default_headers``/``set_default_header`` and
    ``rest_client.pool_manager`` (the aiohttp session) are named as on kubernetes_asyncio's
    ``ApiClient``, so code written against it keeps working. Make it inside the event loop;
    close it (``async with``) when done."""

    def __init__(self, configuration: ClusterConfig, *, pool_size: int = POOL_SIZE) -> None:
        self.configuration = configuration
        self.default_headers: dict[str, str] = {"User-Agent": f"hami/{__version__}"}
        ssl_context = configuration.ssl_context()
        connector = aiohttp.TCPConnector(
            limit=pool_size, ssl=ssl_context if ssl_context is not None else True
        )
        # trust_env=False: with it aiohttp hands every request to a worker thread twice
        # (~/.netrc, proxy variables), about a third of the scheduler's CPU per placed pod;
        # the proxy is resolved once (hami.kube.client.env_proxy).
        self.pool_manager = aiohttp.ClientSession(
            connector=connector, trust_env=False, read_bufsize=READ_BUFSIZE
        )

    @property
    def rest_client(self) -> ApiSession:
        return self

    def set_default_header(self, name: str, value: str) -> None:
        """A header sent with every request (e.g. ``Impersonate-User`` in tests)."""
        self.default_headers[name] = value

    async def close(self) -> None:
        await self.pool_manager.close()

    async def __aenter__(self) -> ApiSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call_api(
        self,
        resource_path: str,
        method: str,
        *,
        query_params: Sequence[tuple[str, Any]] | None = None,
        header_params: dict[str, str] | None = None,
        body: Any = None,
        auth_settings: Sequence[str] | None = None,
        _preload_content: bool = False,
        _return_http_data_only: bool = True,
        _request_timeout: Any = None,
    ) -> aiohttp.ClientResponse:
        """Send one request; the response, unread and with any status (the caller checks
        it and releases the response). ``auth_settings`` empty: no credentials."""
        cfg = self.configuration
        headers = {**(header_params or {}), **self.default_headers}
        headers.setdefault("Content-Type", "application/json")
        if auth_settings is None or auth_settings:
            authorization = await cfg.authorization()
            if authorization:
                headers["Authorization"] = authorization
        url = cfg.host + resource_path
        if query_params:
            url += "?" + urlencode(list(query_params))
        data: Any = None
        if body is not None and method.upper() not in _BODYLESS:
            data = body if isinstance(body, bytes) else orjson.dumps(body)
        extra: dict[str, Any] = {}
        if cfg.proxy:
            extra["proxy"] = cfg.proxy
        if cfg.tls_server_name:
            extra["server_hostname"] = cfg.tls_server_name
        return await self.pool_manager.request(
            method.upper(),
            url,
            headers=headers,
            data=data,
            timeout=client_timeout(_request_timeout),
            **extra,
        )
