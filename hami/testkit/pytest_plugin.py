"""pytest fixtures for tests against the real control plane.

Enable with `pytest_plugins = ["hami.testkit.pytest_plugin"]` in a conftest.py.

- `controlplane` (session): a started `ControlPlane` (etcd + kube-apiserver), shared by
  the whole run. If the binaries are missing or a component does not start, every test
  that uses it errors with the reason and how to fix it; nothing is skipped.
- `kubeconfig` (session): path of its kubeconfig file.
- `kube` (function, async): a `hami.kube.client.Kube` for it (plain JSON, hami's retry
  policy; `kube.api` is the underlying `hami.kube.session.ApiSession`), closed after the
  test.
- `core_v1` (function, async): kubernetes_asyncio's generated `CoreV1Api` on a session of
  its own (its `ApiClient`), for tests that check the control plane against the standard
  client.
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

from hami.kube.client import Kube, load_configuration, open_client, pods_path
from hami.kube.raw import KubeError
from hami.testkit.controlplane import (
    ControlPlane,
    ControlPlaneError,
    SchedulerProcess,
    find_binaries,
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
async def kube(controlplane: ControlPlane) -> AsyncIterator[Kube]:
    async with open_client(controlplane.kubeconfig) as client:
        yield client


@pytest.fixture
async def core_v1(controlplane: ControlPlane) -> AsyncIterator[Any]:
    from kubernetes_asyncio import client

    configuration = await load_configuration(str(controlplane.kubeconfig))
    async with client.ApiClient(configuration) as api:
        yield client.CoreV1Api(api)


async def _force_delete_pods(kube: Kube, field_selector: str) -> None:
    for pod in await kube.list_pods(field_selector=field_selector):
        meta = pod["metadata"]
        with contextlib.suppress(KubeError):
            path = f"{pods_path(meta['namespace'])}/{meta['name']}"
            await kube.delete(path, {"gracePeriodSeconds": 0})


@pytest.fixture
async def namespace(kube: Kube) -> AsyncIterator[str]:
    """A new namespace for this test. Without kube-controller-manager a deleted namespace
    stays Terminating, so only its pods are removed afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    await kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    await _force_delete_pods(kube, f"metadata.namespace={name}")
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{name}")


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
            async with open_client(controlplane.kubeconfig) as kube:
                for kubelet in started:
                    await _force_delete_pods(kube, f"spec.nodeName={kubelet.node_name}")
                    with contextlib.suppress(KubeError):
                        await kube.delete(f"/api/v1/nodes/{kubelet.node_name}")
        shutil.rmtree(base, ignore_errors=True)
