"""The kubelet DRA plugin of one backend: plugin registration and the DRA v1 gRPC service.

kubelet's plugin watcher finds ``{registry_dir}/{driver}-reg.sock`` and calls
``GetInfo`` (type ``DRAPlugin``, the driver name, the DRA socket
``{plugins_dir}/{driver}/dra.sock`` and the service ``v1.DRAPlugin``), then
``NotifyRegistrationStatus``. For each pod it calls ``NodePrepareResources`` with the
pod's claims (namespace, name, uid): the plugin reads each claim and the pods it is reserved
for, validates this driver's allocation results against the node's devices, writes one CDI
spec per claim (one CDI device per group of requests its containers use together,
hami.dra.groups) and answers with the CDI device ids. Prepared claims are checkpointed
(``{plugins_dir}/{driver}/checkpoint.json``), so prepare is idempotent across agent
restarts; unprepare removes the spec and the entry. Every failure is reported for its claim
only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from grpclib.server import Server, Stream

from hami import log
from hami._proto.dra.v1 import api_grpc as dra_grpc
from hami._proto.dra.v1 import api_pb2 as dra_pb2
from hami._proto.pluginregistration.v1 import api_grpc as reg_grpc
from hami._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from hami.backends.base import Backend, Device
from hami.dra import cdi, migprepare, names
from hami.dra.checkpoint import Checkpoint
from hami.dra.claims import EntryCheck, claim_allocation
from hami.dra.groups import base_request
from hami.dra.metrics import DRAMetrics
from hami.dra.prepare import prepare_claim
from hami.kube.raw import KubeError

_log = log.get(__name__)
JSON = dict[str, Any]
CLAIMS_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
PODS_PATH = "/api/v1/namespaces/{namespace}/pods/{name}"
MAX_PODS = 16  # reserving pods read for their containers; a claim may list 256


class ClaimKube(Protocol):
    """What the plugin needs of ``hami.kube.client.Kube``: a GET."""

    async def request(self, method: str, path: str) -> JSON: ...


def _device_message(entry: JSON) -> dra_pb2.Device:
    device = dra_pb2.Device(
        # base names also for checkpoints of versions that answered "gpu/a100"
        request_names=[base_request(str(r)) for r in entry.get("requestNames") or []],
        pool_name=str(entry.get("poolName", "")),
        device_name=str(entry.get("deviceName", "")),
        cdi_device_ids=list(entry.get("cdiDeviceIds") or []),
    )
    if entry.get("shareId"):
        device.share_id = str(entry["shareId"])
    return device


def _make_dirs(paths: Sequence[str]) -> None:
    for path in paths:
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o777)  # HAMi-core in any container user writes its cache there


class DRAService(dra_grpc.DRAPluginBase):
    def __init__(
        self,
        *,
        node: str,
        backend: Backend,
        devices: Callable[[], list[Device]],
        kube: ClaimKube,
        check: EntryCheck,
        cdi_dir: str,
        checkpoint: Checkpoint,
        metrics: DRAMetrics | None = None,
    ) -> None:
        self.node = node
        self.backend = backend
        self.driver = names.driver_name(backend.type_word)
        self.devices = devices
        self.kube = kube
        self.check = check
        self.cdi_dir = cdi_dir
        self.checkpoint = checkpoint
        self.metrics = metrics or DRAMetrics()
        self.metrics.prepared_claims.labels(self.driver).set(len(checkpoint.claims))
        self.log = _log.bind(role="node", node=node, driver=self.driver)
        self._lock = asyncio.Lock()  # checkpoint and spec changes one claim at a time

    async def _prepared(self, uid: str) -> list[JSON] | None:
        """A claim prepared before (kubelet asks again after its own restart or a lost
        answer): the same answer, its spec rewritten if someone removed it. Under the lock."""
        done = self.checkpoint.claims.get(uid)
        if done is None:
            return None
        spec_path = Path(self.cdi_dir) / names.cdi_spec_file(self.driver, uid)
        if not await asyncio.to_thread(spec_path.exists):
            await asyncio.to_thread(cdi.write_spec, self.cdi_dir, self.driver, uid, done["spec"])
        return list(done["devices"])

    async def _pods(self, namespace: str, claim: JSON) -> list[JSON]:
        """The pods the claim is reserved for: their containers say which requests are used
        together. A pod gone (404) or replaced (another uid) is left out; any other error
        fails the prepare (kubelet retries) rather than guess the groups."""
        status = claim.get("status")
        refs = status.get("reservedFor") if isinstance(status, dict) else None
        pods: list[JSON] = []
        for ref in (refs if isinstance(refs, list) else [])[:MAX_PODS]:
            if not isinstance(ref, dict) or ref.get("resource") != "pods" or not ref.get("name"):
                continue
            path = PODS_PATH.format(namespace=namespace, name=ref["name"])
            try:
                pod = await self.kube.request("GET", path)
            except KubeError as exc:
                if exc.status == 404:
                    continue
                raise
            meta = pod.get("metadata")
            if isinstance(meta, dict) and meta.get("uid") == ref.get("uid"):
                pods.append(pod)
        return pods

    async def prepare(self, namespace: str, name: str, uid: str) -> list[JSON]:
        """The devices of one claim (prepared now or before). Raises on failure."""
        async with self._lock:
            done = await self._prepared(uid)
        if done is not None:
            return done
        # the read outside the lock: a burst of pods prepares its claims concurrently
        claim = await self.kube.request("GET", CLAIMS_PATH.format(namespace=namespace, name=name))
        pods = await self._pods(namespace, claim)
        async with self._lock:
            done = await self._prepared(uid)  # a concurrent call for the same claim won
            if done is not None:
                return done
            node_devices = self.devices()
            if migprepare.serves_mig(self.backend, node_devices):
                return await self._prepare_mig(namespace, name, uid, claim, pods, node_devices)
            allocation = claim_allocation(
                claim,
                uid=uid,
                node=self.node,
                backend=self.backend,
                node_devices=node_devices,
                check=self.check,
                pods=pods,
            )
            prepared = prepare_claim(allocation, self.backend, node_devices)
            await asyncio.to_thread(_make_dirs, prepared.host_dirs)
            await asyncio.to_thread(cdi.write_spec, self.cdi_dir, self.driver, uid, prepared.spec)
            entry = {
                "namespace": namespace,
                "name": name,
                "devices": prepared.devices,
                "spec": prepared.spec,
            }
            await asyncio.to_thread(self.checkpoint.put, uid, entry)
            self.metrics.prepared_claims.labels(self.driver).set(len(self.checkpoint.claims))
            self.log.info(
                "dra_claim_prepared",
                claim=f"{namespace}/{name}",
                uid=uid,
                devices=[
                    f"{d.device}:{d.slice.memory}MiB/{d.slice.cores}%" for d in allocation.devices
                ],
                admin_access=allocation.admin_access,
                groups=["+".join(g.requests) for g in prepared.groups],
            )
            return prepared.devices

    async def _prepare_mig(
        self,
        namespace: str,
        name: str,
        uid: str,
        claim: JSON,
        pods: list[JSON],
        node_devices: list[Device],
    ) -> list[JSON]:
        """A claim on MIG partitions (``migprepare``): its instances made, then as above.
        Under the lock."""
        prepared = await asyncio.to_thread(
            migprepare.prepare_mig_claim,
            claim,
            uid=uid,
            node=self.node,
            backend=self.backend,
            node_devices=node_devices,
            pods=pods,
        )
        await asyncio.to_thread(cdi.write_spec, self.cdi_dir, self.driver, uid, prepared.spec)
        entry = {"namespace": namespace, "name": name, "devices": prepared.devices}
        await asyncio.to_thread(self.checkpoint.put, uid, {**entry, "spec": prepared.spec})
        self.metrics.prepared_claims.labels(self.driver).set(len(self.checkpoint.claims))
        self.log.info(
            "dra_claim_prepared",
            claim=f"{namespace}/{name}",
            uid=uid,
            devices=[d["deviceName"] for d in prepared.devices],
            mig=[g.allocation.envs.get(migprepare.VISIBLE_DEVICES) for g in prepared.groups],
        )
        return prepared.devices

    async def unprepare(self, uid: str) -> None:
        async with self._lock:
            # MIG instances first: when one cannot go (a process still on it) the claim
            # stays prepared and kubelet asks again
            problems = await asyncio.to_thread(migprepare.release_claim, self.backend, uid)
            if problems:
                raise RuntimeError(
                    f"MIG instances of claim {uid} not removed: {'; '.join(problems)}"
                )
            await asyncio.to_thread(cdi.remove_spec, self.cdi_dir, self.driver, uid)
            await asyncio.to_thread(self.checkpoint.drop, uid)
            self.metrics.unprepares.labels(self.driver).inc()
            self.metrics.prepared_claims.labels(self.driver).set(len(self.checkpoint.claims))
            self.log.info("dra_claim_unprepared", uid=uid)

    async def NodePrepareResources(
        self,
        stream: Stream[dra_pb2.NodePrepareResourcesRequest, dra_pb2.NodePrepareResourcesResponse],
    ) -> None:
        request = await stream.recv_message()
        assert request is not None
        answers: dict[str, dra_pb2.NodePrepareResourceResponse] = {}
        for claim in request.claims:
            repeated = claim.uid in self.checkpoint.claims
            try:
                devices = await self.prepare(claim.namespace, claim.name, claim.uid)
            except Exception as exc:
                self.metrics.prepares.labels(self.driver, "error").inc()
                message = str(exc) or repr(exc)
                self.log.warning(
                    "dra_prepare_failed",
                    claim=f"{claim.namespace}/{claim.name}",
                    uid=claim.uid,
                    error=message,
                )
                answers[claim.uid] = dra_pb2.NodePrepareResourceResponse(error=message)
            else:
                result = "repeated" if repeated else "prepared"
                self.metrics.prepares.labels(self.driver, result).inc()
                answers[claim.uid] = dra_pb2.NodePrepareResourceResponse(
                    devices=[_device_message(d) for d in devices]
                )
        await stream.send_message(dra_pb2.NodePrepareResourcesResponse(claims=answers))

    async def NodeUnprepareResources(
        self,
        stream: Stream[
            dra_pb2.NodeUnprepareResourcesRequest, dra_pb2.NodeUnprepareResourcesResponse
        ],
    ) -> None:
        request = await stream.recv_message()
        assert request is not None
        answers: dict[str, dra_pb2.NodeUnprepareResourceResponse] = {}
        for claim in request.claims:
            try:
                await self.unprepare(claim.uid)
            except Exception as exc:
                message = str(exc) or repr(exc)
                self.log.warning("dra_unprepare_failed", uid=claim.uid, error=message)
                answers[claim.uid] = dra_pb2.NodeUnprepareResourceResponse(error=message)
            else:
                answers[claim.uid] = dra_pb2.NodeUnprepareResourceResponse()
        await stream.send_message(dra_pb2.NodeUnprepareResourcesResponse(claims=answers))


class RegistrationService(reg_grpc.RegistrationBase):
    def __init__(self, driver: str, endpoint: str, node: str = "") -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.registered = asyncio.Event()
        self.error = ""
        self.log = _log.bind(role="node", node=node, driver=driver)

    async def GetInfo(self, stream: Stream[reg_pb2.InfoRequest, reg_pb2.PluginInfo]) -> None:
        await stream.recv_message()
        await stream.send_message(
            reg_pb2.PluginInfo(
                type=names.PLUGIN_TYPE,
                name=self.driver,
                endpoint=self.endpoint,
                supported_versions=[names.DRA_SERVICE],
            )
        )

    async def NotifyRegistrationStatus(
        self, stream: Stream[reg_pb2.RegistrationStatus, reg_pb2.RegistrationStatusResponse]
    ) -> None:
        status = await stream.recv_message()
        assert status is not None
        if status.plugin_registered:
            self.error = ""
            self.registered.set()
            self.log.info("dra_plugin_registered")
        else:
            self.error = status.error
            self.registered.clear()
            self.log.error("dra_plugin_registration_refused", error=status.error)
        await stream.send_message(reg_pb2.RegistrationStatusResponse())


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class DRAPluginServer:
    """Serves the DRA service and its registration socket; serves them again when kubelet
    (or anyone) removes a socket, and removes its own sockets when it stops."""

    def __init__(
        self,
        service: DRAService,
        *,
        plugins_dir: str | os.PathLike[str],
        registry_dir: str | os.PathLike[str],
        poll: float = 1.0,
    ) -> None:
        self.service = service
        driver = service.driver
        self.plugin_dir = Path(plugins_dir) / driver
        self.dra_socket = self.plugin_dir / "dra.sock"
        self.registry_dir = Path(registry_dir)
        self.reg_socket = self.registry_dir / f"{driver}-reg.sock"
        for path in (self.dra_socket, self.reg_socket):
            if len(str(path)) >= 108:
                raise ValueError(f"unix socket path too long (max 107 bytes): {path}")
        self.registration = RegistrationService(driver, str(self.dra_socket), service.node)
        self.poll = poll
        self.serving = asyncio.Event()
        self.log = service.log
        self._servers: dict[Path, tuple[Server, tuple[int, int] | None]] = {}

    async def _serve(self, path: Path, handler: Any) -> None:
        await self._close(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = Server([handler])
        await server.start(path=str(path))
        self._servers[path] = (server, _identity(path))
        self.log.info("dra_socket_serving", socket=str(path))

    async def _close(self, path: Path) -> None:
        entry = self._servers.pop(path, None)
        if entry is None:
            return
        server, own = entry
        server.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await server.wait_closed()
        if _identity(path) == own:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    async def run(self) -> None:
        # the DRA socket first: kubelet connects to it as soon as registration succeeds
        handlers = ((self.dra_socket, self.service), (self.reg_socket, self.registration))
        try:
            for path, handler in handlers:
                await self._serve(path, handler)
            self.serving.set()
            while True:
                await asyncio.sleep(self.poll)
                for path, handler in handlers:
                    entry = self._servers.get(path)
                    if entry is None or _identity(path) != entry[1]:
                        self.log.info("dra_socket_removed", socket=str(path))
                        await self._serve(path, handler)
        finally:
            self.serving.clear()
            for path, _ in handlers:
                await self._close(path)
