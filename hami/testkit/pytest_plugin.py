"""pytest fixtures for tests against the real control plane.

Enable with `pytest_plugins = ["hami.testkit.pytest_plugin"]` in a conftest.py.

- `controlplane` (session): a started `ControlPlane` (etcd + kube-apiserver), shared by
  the whole run. If the binaries are missing or a component does not start, every test
  that uses it errors with the reason and how to fix it; nothing is skipped.
- `kubeconfig` (session): path of its kubeconfig file.
- `api_client` / `core_v1` (function, async): a kubernetes_asyncio `ApiClient` /
  `CoreV1Api` bound to it, closed after the test.
- `namespace` (function, async): a fresh namespace; its pods are force-deleted afterwards.
- `kube_scheduler` (function): `await kube_scheduler(config, name=None)` starts a
  kube-scheduler with that KubeSchedulerConfiguration (dict or YAML) and returns its
  `SchedulerProcess`; stopped after the test.
- `kubelet_factory` (function, async): `await kubelet_factory("node-a", **kwargs)` starts
  a `KubeletEmulator` with a short plugin dir under /tmp; after the test it is stopped and
  its Node and the pods bound to it are deleted.

Tests that use `controlplane` (directly or through these fixtures) get the `controlplane`
marker, so `pytest -m "not controlplane"` runs the rest. The run's summary line says how
long the control plane took to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from hami.testkit.controlplane import (
    ControlPlane,
    ControlPlaneError,
    SchedulerProcess,
    find_binaries,
)
from hami.testkit.controlplane import (
    api_client as _api_client,
)
from hami.testkit.kubelet import KubeletEmulator

_startup: dict[str, float] = {}

SchedulerFactory = Callable[..., Awaitable[SchedulerProcess]]
KubeletFactory = Callable[..., Awaitable[KubeletEmulator]]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "controlplane: needs the real etcd/kube-apiserver/kube-scheduler"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "controlplane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.controlplane)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if "controlplane" in _startup:
        terminalreporter.write_line(
            f"hami testkit: control plane (etcd + kube-apiserver) ready in "
            f"{_startup['controlplane']:.1f}s"
        )
    if "scheduler" in _startup:
        terminalreporter.write_line(
            f"hami testkit: first kube-scheduler ready in {_startup['scheduler']:.1f}s"
        )


@pytest.fixture(scope="session")
def controlplane() -> Iterator[ControlPlane]:
    try:
        plane = ControlPlane(binaries=find_binaries())
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"cannot start the test control plane: {exc}", pytrace=False)
    assert plane.startup_seconds is not None
    _startup["controlplane"] = plane.startup_seconds
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kubeconfig(controlplane: ControlPlane) -> Path:
    return controlplane.kubeconfig


@pytest.fixture
async def api_client(controlplane: ControlPlane) -> AsyncIterator[Any]:
    async with _api_client(controlplane.kubeconfig) as api:
        yield api


@pytest.fixture
def core_v1(api_client: Any) -> Any:
    from kubernetes_asyncio import client

    return client.CoreV1Api(api_client)


async def _force_delete_pods(core: Any, **selector: str) -> None:
    listing = await core.list_pod_for_all_namespaces(**selector)
    for pod in listing.items:
        with contextlib.suppress(Exception):
            await core.delete_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
            )


@pytest.fixture
async def namespace(core_v1: Any) -> AsyncIterator[str]:
    """A new namespace for this test. Without kube-controller-manager a deleted namespace
    stays Terminating, so only its pods are removed afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    await core_v1.create_namespace({"metadata": {"name": name}})
    yield name
    await _force_delete_pods(core_v1, field_selector=f"metadata.namespace={name}")
    with contextlib.suppress(Exception):
        await core_v1.delete_namespace(name)


@pytest.fixture
def kube_scheduler(controlplane: ControlPlane) -> Iterator[SchedulerFactory]:
    started: list[SchedulerProcess] = []

    async def start(
        config: Mapping[str, Any] | str,
        name: str | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109
    ) -> SchedulerProcess:
        loop = asyncio.get_running_loop()
        began = loop.time()
        # launched from the loop's thread (the parent-death signal follows the thread that
        # forks); only the readiness poll runs in a worker thread
        sched = controlplane.start_scheduler(config, name, wait=False)
        started.append(sched)
        await asyncio.to_thread(sched.wait_ready, timeout)
        _startup.setdefault("scheduler", loop.time() - began)
        return sched

    yield start
    for sched in started:
        sched.stop()
        with contextlib.suppress(ValueError):
            controlplane.schedulers.remove(sched)


@pytest.fixture
async def kubelet_factory(controlplane: ControlPlane) -> AsyncIterator[KubeletFactory]:
    started: list[KubeletEmulator] = []
    base = Path(tempfile.mkdtemp(prefix="hk-", dir="/tmp"))

    async def make(node_name: str, **kwargs: Any) -> KubeletEmulator:
        plugin_dir = kwargs.pop("plugin_dir", None) or base / f"{len(started)}"
        kubelet = KubeletEmulator(node_name, controlplane.kubeconfig, plugin_dir, **kwargs)
        await kubelet.start()
        started.append(kubelet)
        return kubelet

    try:
        yield make
    finally:
        for kubelet in started:
            await kubelet.stop()
        if started:
            async with _api_client(controlplane.kubeconfig) as api:
                from kubernetes_asyncio import client

                core = client.CoreV1Api(api)
                for kubelet in started:
                    await _force_delete_pods(
                        core, field_selector=f"spec.nodeName={kubelet.node_name}"
                    )
                    with contextlib.suppress(Exception):
                        await core.delete_node(kubelet.node_name)
        shutil.rmtree(base, ignore_errors=True)
