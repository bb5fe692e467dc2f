"""The one Kubernetes client of both roles and the test kit: ``Kube``.

``open_client`` builds it (in-cluster, else a kubeconfig file: ``hami.kube.kubeconfig``)
on an ``hami.kube.session.ApiSession``; neither imports kubernetes_asyncio's generated
client package (36 MiB of the node agent's memory otherwise). Every method speaks plain
JSON dicts (the generated models cost far more to build than the JSON they come from, and
the roles read only a few fields) and follows one retry policy (``hami.kube.raw``): capped
exponential back-off with full jitter on HTTP 429 (honouring ``Retry-After``), 5xx and
connection errors; a request that may have been applied already (a POST that reached the
server) is not repeated. ``with_retry`` gives the same session with another policy, e.g.
``PATIENT_RETRY`` for kubelet's Allocate, which has no deadline of its own. Errors are
``hami.kube.raw``'s: ``KubeError`` and its ``NotFound``, ``Conflict``, ``Gone`` and
``Unreachable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from hami.kube.kubeconfig import KubeConfigError as KubeConfigError  # the roles catch it here
from hami.kube.kubeconfig import default_kubeconfig, load_cluster_config
from hami.kube.raw import (
    DEFAULT_RETRY,
    DEFAULT_TIMEOUT,
    JSON,
    MERGE_PATCH,
    STATUS_ERRORS,
    KubeError,
    RetryPolicy,
    Unreachable,
    loads,
    parse_retry_after,
    with_retry,
)
from hami.kube.session import ApiSession as ApiSession

Query = Sequence[tuple[str, Any]]
Timeout = float | aiohttp.ClientTimeout | None
LIST_TIMEOUT = 120.0
PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class Page:
    """One answer of a paged list: its items and the list's resourceVersion."""

    items: list[JSON]
    resource_version: str
    last: bool


class Transport(Protocol):
    """What ``Kube`` sends through: an ``ApiSession``, or kubernetes_asyncio's
    ``ApiClient`` (same keywords; tests that need its generated API build one)."""

    async def call_api(
        self,
        resource_path: str,
        method: str,
        *,
        query_params: Any = None,
        header_params: Any = None,
        body: Any = None,
        auth_settings: Any = None,
        _preload_content: bool = ...,
        _return_http_data_only: Any = None,
        _request_timeout: Any = None,
    ) -> Any: ...


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def pods_path(namespace: str | None = None) -> str:
    return f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"


def annotation_patch(
    annotations: Mapping[str, str | None], resource_version: str | None = None
) -> JSON:
    """A merge patch of annotations (None deletes a key); with ``resource_version`` the API
    server rejects it with 409 if the object changed since."""
    meta: JSON = {"annotations": dict(annotations)}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


class Kube:
    """An authenticated session to the API server plus the retry policy its requests follow.

    ``api`` is the underlying session (``ApiSession``: its configuration and default
    headers), for the rare code that needs it; everything else goes through the methods.
    ``sleep`` and ``clock`` drive the retry back-off (injectable for tests)."""

    def __init__(
        self,
        api: Transport,
        retry: RetryPolicy = DEFAULT_RETRY,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.api = api
        self.retry = retry
        self._sleep = sleep
        self._clock = clock

    def with_retry(self, policy: RetryPolicy) -> Kube:
        """The same session, with ``policy`` for every request."""
        return Kube(self.api, policy, sleep=self._sleep, clock=self._clock)

    # ------------------------------------------------------------------ generic

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Query = (),
        content_type: str = "application/json",
        request_timeout: float = DEFAULT_TIMEOUT,
    ) -> JSON:
        """Send a request (retried as the policy says); the decoded JSON body."""

        async def attempt() -> JSON:
            response = await self._open(method, path, body, query, content_type, request_timeout)
            try:
                data = await response.read()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                raise Unreachable(repr(exc), path, sent=True) from exc
            finally:
                response.release()
            decoded: JSON = loads(data) if data else {}
            return decoded

        result: JSON = await with_retry(method, attempt, self.retry, self._sleep, self._clock)
        return result

    @asynccontextmanager
    async def stream(
        self, path: str, *, query: Query = (), request_timeout: Timeout = None
    ) -> AsyncIterator[AsyncIterator[JSON]]:
        """A watch: the JSON objects of a line-delimited answer, as they arrive. Not
        retried (a watcher re-lists and backs off itself); the answer is released on exit.
        A line that is not JSON raises ValueError."""
        response = await self._open("GET", path, None, query, "application/json", request_timeout)
        try:
            yield _json_lines(response)
        finally:
            response.release()

    async def list_all(
        self,
        path: str,
        *,
        query: Query = (),
        page_size: int = PAGE_SIZE,
        request_timeout: float = LIST_TIMEOUT,
    ) -> tuple[list[JSON], str]:
        """Every item of a list, fetched ``page_size`` at a time (``limit``/``continue``),
        and the list's resourceVersion (the snapshot a watch continues from). An expired
        continue token raises Gone: the caller lists again from the start."""
        items: list[JSON] = []
        version = ""
        async for page in self.list_pages(
            path, query=query, page_size=page_size, request_timeout=request_timeout
        ):
            items.extend(page.items)
            version = page.resource_version
        return items, version

    async def list_pages(
        self,
        path: str,
        *,
        query: Query = (),
        page_size: int = PAGE_SIZE,
        request_timeout: float = LIST_TIMEOUT,
    ) -> AsyncIterator[Page]:
        """A list one page at a time, as each arrives, so a caller need not hold the whole
        list (millions of JSON objects at 65,000 nodes). Every page of one list is the same
        snapshot; ``last`` marks the page without a continue token. An expired continue
        token raises Gone after the pages before it: the caller lists again from the start."""
        token: str | None = None
        while True:
            answer = await self.request(
                "GET",
                path,
                query=[*query, ("limit", page_size), ("continue", token)],
                request_timeout=request_timeout,
            )
            meta = answer.get("metadata") or {}
            token = meta.get("continue") or None
            page = Page(
                answer.get("items") or [], str(meta.get("resourceVersion") or ""), not token
            )
            # Hold nothing of this page while the caller works on it and the next one
            # loads: a page kept alive here would outlive the caller's use of it.
            del answer, meta
            yield page
            del page
            if not token:
                return

    async def create(
        self, path: str, body: Any, *, request_timeout: float = DEFAULT_TIMEOUT
    ) -> JSON:
        """POST ``body`` to a collection (or a subresource such as a Binding)."""
        return await self.request("POST", path, body=body, request_timeout=request_timeout)

    async def delete(self, path: str, body: Any = None, *, query: Query = ()) -> JSON:
        return await self.request("DELETE", path, body=body, query=query)

    async def merge_patch(self, path: str, body: Any) -> JSON:
        """A JSON merge patch (labels, taints, a status subresource, ...)."""
        return await self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    # ------------------------------------------------------------------ nodes and pods

    async def get_node(self, name: str) -> JSON:
        return await self.request("GET", node_path(name))

    async def get_pod(self, namespace: str, name: str) -> JSON:
        return await self.request("GET", pod_path(namespace, name))

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[JSON]:
        query = [("fieldSelector", field_selector), ("labelSelector", label_selector)]
        items, _version = await self.list_all(pods_path(namespace), query=query)
        return items

    async def patch_node_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> JSON:
        """Merge-patch a Node's annotations (None deletes a key); 409 raises Conflict."""
        return await self.merge_patch(
            node_path(name), annotation_patch(annotations, resource_version)
        )

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> JSON:
        """Merge-patch a Pod's annotations (None deletes a key); 409 raises Conflict."""
        return await self.merge_patch(
            pod_path(namespace, name), annotation_patch(annotations, resource_version)
        )

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        node: str,
        *,
        resource_version: str | None = None,
        annotations: Mapping[str, str] | None = None,
        request_timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """Create the pod's Binding to ``node`` (what kube-scheduler's default binder does).

        With ``resource_version`` the API server binds only the pod at that version (it
        answers 409 Conflict otherwise): the pod is bound with exactly the annotations the
        caller saw. ``annotations`` are merged into the pod's in the same write (the API
        server adds or overwrites them with ``spec.nodeName``; it never deletes one)."""
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if annotations:
            body["metadata"]["annotations"] = dict(annotations)
        if uid:
            body["metadata"]["uid"] = uid
        if resource_version:
            body["metadata"]["resourceVersion"] = resource_version
        await self.create(
            pod_path(namespace, name) + "/binding", body, request_timeout=request_timeout
        )

    # ------------------------------------------------------------------ one try

    async def _open(
        self,
        method: str,
        path: str,
        body: Any,
        query: Query,
        content_type: str,
        request_timeout: Timeout,
    ) -> aiohttp.ClientResponse:
        """Start one request; the aiohttp response, its status already checked."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            response: aiohttp.ClientResponse = await self.api.call_api(
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
        except aiohttp.ClientConnectorError as exc:
            # Refused or unresolvable: the request never left this process.
            raise Unreachable(repr(exc), path, sent=False) from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise Unreachable(repr(exc), path, sent=True) from exc
        except Exception as exc:
            if not _is_api_exception(exc):
                raise
            raise KubeError(exc.status or 0, str(exc.reason), str(exc.body or ""), path) from exc  # type: ignore[attr-defined]
        if not 200 <= response.status <= 299:
            raise await _status_error(response, path)
        return response


def _is_api_exception(exc: Exception) -> bool:
    """kubernetes_asyncio's ApiException (only its ApiClient raises one), checked without
    importing its client package where nothing else did."""
    module = sys.modules.get("kubernetes_asyncio.client.exceptions")
    return module is not None and isinstance(exc, module.ApiException)


async def _status_error(response: aiohttp.ClientResponse, path: str) -> KubeError:
    try:
        text = (await response.read()).decode("utf-8", "replace")
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        text = repr(exc)
    finally:
        response.release()
    message = text
    with contextlib.suppress(ValueError, AttributeError):
        message = loads(text).get("message", text)
    error = STATUS_ERRORS.get(response.status, KubeError)(
        response.status, str(response.reason), message, path
    )
    error.retry_after = parse_retry_after(response.headers.get("Retry-After"))
    return error


async def _json_lines(response: aiohttp.ClientResponse) -> AsyncIterator[JSON]:
    """The JSON objects of a line-delimited stream, in time linear in its length: each
    chunk is scanned once and a line split over chunks is joined once (re-splitting a
    growing buffer copied it once per line)."""
    parts: list[bytes] = []  # the start of a line that has not ended yet
    async for chunk in response.content.iter_any():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line = chunk[start:end]
            if parts:
                parts.append(line)
                line = b"".join(parts)
                parts.clear()
            start = end + 1
            if line.strip():
                event: JSON = loads(line)
                yield event
        if start < len(chunk):
            parts.append(chunk[start:])


# --------------------------------------------------------------------------- construction


async def load_configuration(kubeconfig: str | None = None) -> Any:
    """kubernetes_asyncio's ``Configuration`` of the same choice as ``open_client``, for code
    that uses its generated API (tests). Imports ``kubernetes_asyncio.client``: the roles
    never call it."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(
            config_file=default_kubeconfig(), client_configuration=configuration
        )
    return configuration


@asynccontextmanager
async def open_client(
    kubeconfig: str | os.PathLike[str] | None = None, retry: RetryPolicy = DEFAULT_RETRY
) -> AsyncIterator[Kube]:
    """A ``Kube`` whose HTTP session is closed on exit. Configuration errors raise
    ``KubeConfigError`` naming the file (or variable) and the fix."""
    configuration = await load_cluster_config(os.fspath(kubeconfig) if kubeconfig else None)
    if configuration.proxy is None:
        configuration.proxy = env_proxy(configuration.host)
    async with ApiSession(configuration) as api:
        yield Kube(api, retry)


def env_proxy(server: str) -> str | None:
    """The proxy ``HTTPS_PROXY``/``HTTP_PROXY`` name for the API server (None: none, or
    ``NO_PROXY`` covers it), read once when the client is made."""
    with contextlib.suppress(LookupError, ValueError):
        proxy, auth = get_env_proxy_for_url(URL(server))
        if auth is not None:
            proxy = proxy.with_user(auth.login).with_password(auth.password)
        return str(proxy)
    return None
