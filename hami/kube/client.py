"""One place that builds the API client: in-cluster, else a kubeconfig file."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from kubernetes_asyncio import client, config

from hami import log

_log = log.get(__name__)


class KubeConfigError(RuntimeError):
    """No way to reach the API server was found; the message says which were tried."""


async def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    configuration = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return configuration
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return configuration
    path = _default_kubeconfig()
    await config.load_kube_config(config_file=path, client_configuration=configuration)
    return configuration


def _default_kubeconfig() -> str:
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if not os.path.exists(path):
        raise KubeConfigError(
            "no API server configured: not in a cluster (KUBERNETES_SERVICE_HOST unset) and no "
            f"kubeconfig at {path}; pass --kubeconfig or set KUBECONFIG"
        )
    return path


@asynccontextmanager
async def open_client(kubeconfig: str | None = None) -> AsyncIterator[client.ApiClient]:
    """An ApiClient whose HTTP session is closed on exit."""
    configuration = await load_configuration(kubeconfig)
    async with client.ApiClient(configuration) as api:
        yield api
