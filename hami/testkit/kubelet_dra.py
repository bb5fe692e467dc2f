"""The kubelet emulator's DRA side: plugin discovery, NodePrepareResources, CDI environment.

What kubelet 1.36 does, as far as a DRA driver and the API server can see it:

- plugin watcher: every ``*.sock`` that appears in the registration directory
  (``/var/lib/kubelet/plugins_registry`` on a node) is asked ``GetInfo``; a ``DRAPlugin``
  whose supported versions include the v1 DRA service is accepted and told so with
  ``NotifyRegistrationStatus(plugin_registered=True)``; anything else is told why not. A
  socket that goes away (or is replaced) unregisters its driver.
- after admission (device plugin ``Allocate``, one pod at a time), each pod's worker (pod
  workers run in parallel) prepares the pod's claims before its containers start: they are
  resolved (``spec.resourceClaims``,
  the names ``status.resourceClaimStatuses`` gives for template claims, and
  ``status.extendedResourceClaimStatus`` for an extended resource that a DeviceClass maps),
  each claim must be allocated and reserved for the pod, and each driver is called once
  with ``NodePrepareResources`` for its claims. The CDI device ids it returns name devices
  in the CDI spec files the driver wrote; the container gets their ``containerEdits`` (the
  emulator records the environment).
- when that fails the pod stays Pending (ContainerCreating) with a Warning Event
  ``FailedPrepareDynamicResources`` "Failed to prepare dynamic resources: ..." and kubelet
  tries again later (kuberuntime_manager.go SyncPod); it is not failed.
- when the pod is gone its claims are unprepared with ``NodeUnprepareResources`` (once no
  other pod on the node uses them).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from grpclib.client import Channel

from hami._proto.dra.v1 import api_grpc as dra_grpc
from hami._proto.dra.v1 import api_pb2 as dra_pb2
from hami._proto.pluginregistration.v1 import api_grpc as reg_grpc
from hami._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from hami.kube.client import Kube

log = logging.getLogger("hami.testkit.kubelet")

DRA_PLUGIN_TYPE = "DRAPlugin"
#: the gRPC service kubelet 1.36 calls; plugins list it in supported_versions
DRA_SERVICE = "v1.DRAPlugin"
FAILED_PREPARE = "FailedPrepareDynamicResources"
RESOURCE_API = "/apis/resource.k8s.io/v1"


class PrepareError(Exception):
    """A pod's claims could not be prepared (the message is what the Event says)."""


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


@dataclass
class DRAPlugin:
    """A registered DRA driver."""

    driver: str
    endpoint: str
    versions: list[str]
    #: the registration socket it came from, and that file's identity
    registration: Path
    socket: tuple[int, int] | None


@dataclass
class PreparedDevice:
    request_names: list[str]
    pool: str
    device: str
    cdi_ids: list[str]
    share_id: str | None


@dataclass
class PreparedClaim:
    namespace: str
    name: str
    uid: str
    driver: str
    devices: list[PreparedDevice] = field(default_factory=list)
    #: uids of the pods on this node using it
    pods: set[str] = field(default_factory=set)


def claim_path(namespace: str, name: str) -> str:
    return f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}"


def pod_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's claim entries (``spec.resourceClaims[].name``) -> ResourceClaim name.
    Raises PrepareError for a template claim the controller has not created yet."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = {
        s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
    }
    out: dict[str, str] = {}
    for entry in spec.get("resourceClaims") or []:
        name = entry.get("name")
        if entry.get("resourceClaimName"):
            out[name] = entry["resourceClaimName"]
        elif entry.get("resourceClaimTemplateName"):
            claim = generated.get(name)
            if not claim:
                raise PrepareError(f"waiting for resource claim of {name!r} to be created")
            out[name] = claim
    return out


class CDIRegistry:
    """CDI spec files (JSON or YAML) in some directories, looked up by fully qualified id
    ``vendor/class=name``; read afresh on each lookup, as a runtime does at container
    creation."""

    def __init__(self, dirs: Sequence[Path]) -> None:
        self.dirs = list(dirs)

    def _specs(self) -> Iterable[dict[str, Any]]:
        for d in self.dirs:
            if not d.is_dir():
                continue
            for path in sorted(d.iterdir()):
                if path.suffix not in (".json", ".yaml", ".yml"):
                    continue
                try:
                    text = path.read_text()
                    spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
                except (OSError, ValueError, yaml.YAMLError) as exc:
                    log.warning("CDI spec %s unreadable: %r", path, exc)
                    continue
                if isinstance(spec, dict):
                    yield spec

    def env(self, cdi_ids: Sequence[str]) -> list[str]:
        """``KEY=VALUE`` entries in the order the edits apply (spec-wide edits, then the
        device's). Raises PrepareError for an id no spec defines."""
        wanted = list(cdi_ids)
        found: dict[str, list[str]] = {}
        for spec in self._specs():
            kind = str(spec.get("kind", ""))
            common = list((spec.get("containerEdits") or {}).get("env") or [])
            for dev in spec.get("devices") or []:
                cid = f"{kind}={dev.get('name')}"
                if cid in wanted and cid not in found:
                    found[cid] = common + list((dev.get("containerEdits") or {}).get("env") or [])
        missing = [c for c in wanted if c not in found]
        if missing:
            raise PrepareError(f"CDI devices {missing} are in no spec file under {self.dirs}")
        return [e for c in wanted for e in found[c]]


class DRAClient:
    """The emulator's DRA manager for one node (see the module docstring)."""

    def __init__(self, node_name: str, registry_dir: Path, cdi_dirs: Sequence[Path]) -> None:
        self.node_name = node_name
        self.registry_dir = registry_dir
        self.cdi = CDIRegistry(cdi_dirs)
        #: driver name -> plugin
        self.plugins: dict[str, DRAPlugin] = {}
        #: claim uid -> what prepare answered
        self.prepared: dict[str, PreparedClaim] = {}
        #: every NodePrepareResources / NodeUnprepareResources call: (driver, claim uids)
        self.prepare_calls: list[tuple[str, list[str]]] = []
        self.unprepare_calls: list[tuple[str, list[str]]] = []
        #: registration sockets answered, by identity (a new file at a path is asked again)
        self._seen: dict[Path, tuple[int, int] | None] = {}

    # ------------------------------------------------------------------ registration

    async def scan(self) -> bool:
        """One pass of the plugin watcher; True when the set of drivers changed."""
        changed = False
        present: dict[Path, tuple[int, int] | None] = {}
        if self.registry_dir.is_dir():
            for path in self.registry_dir.glob("*.sock"):
                present[path] = _identity(path)
        for driver, plugin in list(self.plugins.items()):
            if present.get(plugin.registration) != plugin.socket:
                log.warning("%s: DRA driver %s went away", self.node_name, driver)
                del self.plugins[driver]
                changed = True
        for path in list(self._seen):
            if present.get(path) != self._seen[path]:
                del self._seen[path]
        for path, ident in present.items():
            if path in self._seen:
                continue
            self._seen[path] = ident
            with contextlib.suppress(Exception):
                changed |= await self._register(path, ident)
        return changed

    async def _register(self, path: Path, ident: tuple[int, int] | None) -> bool:
        channel = Channel(path=str(path))
        try:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=5)
            error = ""
            if info.type != DRA_PLUGIN_TYPE:
                log.info("%s: %s is a %s plugin, not DRA", self.node_name, path, info.type)
                return False  # another kind of plugin: not ours to answer
            if DRA_SERVICE not in info.supported_versions:
                error = f"none of {list(info.supported_versions)} is supported, want {DRA_SERVICE}"
            elif not info.name:
                error = "empty driver name"
            await stub.NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=not error, error=error), timeout=5
            )
            if error:
                log.warning("%s: DRA plugin %s refused: %s", self.node_name, path, error)
                return False
            endpoint = info.endpoint or str(path)
            self.plugins[info.name] = DRAPlugin(
                info.name, endpoint, list(info.supported_versions), path, ident
            )
            log.info("%s: DRA driver %s registered at %s", self.node_name, info.name, endpoint)
            return True
        finally:
            channel.close()

    # ------------------------------------------------------------------ prepare

    async def prepare(self, kube: Kube, pod: Mapping[str, Any]) -> dict[str, list[str]]:
        """Prepare the pod's claims; container name -> the env entries its CDI devices give.
        Raises PrepareError (the pod must wait and try again)."""
        meta = pod["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]
        names = pod_claim_names(pod)
        ext = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
        claim_names = set(names.values())
        if ext.get("resourceClaimName"):
            claim_names.add(ext["resourceClaimName"])
        if not claim_names:
            return {}
        claims: dict[str, dict[str, Any]] = {}
        for name in sorted(claim_names):
            try:
                claim = await kube.request("GET", claim_path(namespace, name))
            except Exception as exc:
                raise PrepareError(f"resource claim {namespace}/{name}: {exc}") from None
            status = claim.get("status") or {}
            if not status.get("allocation"):
                raise PrepareError(f"resource claim {namespace}/{name} is not allocated")
            if not any(r.get("uid") == uid for r in status.get("reservedFor") or []):
                raise PrepareError(
                    f"pod {namespace}/{meta['name']} is not allowed to use resource claim "
                    f"{name}: it is not reserved for the pod"
                )
            claims[name] = claim
        await self._prepare_claims(namespace, uid, claims)
        return self._container_env(pod, names, ext, claims)

    async def _prepare_claims(
        self, namespace: str, pod_uid: str, claims: Mapping[str, dict[str, Any]]
    ) -> None:
        by_driver: dict[str, list[dict[str, Any]]] = {}
        for claim in claims.values():
            results = claim["status"]["allocation"].get("devices", {}).get("results") or []
            for driver in sorted({str(r.get("driver")) for r in results}):
                by_driver.setdefault(driver, []).append(claim)
        for driver, group in by_driver.items():
            todo = [c for c in group if c["metadata"]["uid"] not in self.prepared]
            if todo:
                await self._call_prepare(driver, namespace, todo)
            for c in group:
                self.prepared[c["metadata"]["uid"]].pods.add(pod_uid)

    async def _call_prepare(
        self, driver: str, namespace: str, claims: Sequence[dict[str, Any]]
    ) -> None:
        plugin = self.plugins.get(driver)
        if plugin is None:
            raise PrepareError(f"DRA driver {driver} is not registered")
        request = dra_pb2.NodePrepareResourcesRequest(
            claims=[
                dra_pb2.Claim(
                    namespace=namespace, uid=c["metadata"]["uid"], name=c["metadata"]["name"]
                )
                for c in claims
            ]
        )
        uids = [c["metadata"]["uid"] for c in claims]
        self.prepare_calls.append((driver, uids))
        channel = Channel(path=plugin.endpoint)
        try:
            resp = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=45)
        except Exception as exc:
            raise PrepareError(f"NodePrepareResources failed for driver {driver}: {exc}") from None
        finally:
            channel.close()
        for c in claims:
            uid = c["metadata"]["uid"]
            answer = resp.claims.get(uid)
            if answer is None:
                raise PrepareError(f"NodePrepareResources left out claim {c['metadata']['name']}")
            if answer.error:
                raise PrepareError(
                    f"NodePrepareResources failed for claim {namespace}/{c['metadata']['name']}: "
                    f"{answer.error}"
                )
            self.prepared[uid] = PreparedClaim(
                namespace,
                c["metadata"]["name"],
                uid,
                driver,
                [
                    PreparedDevice(
                        list(d.request_names),
                        d.pool_name,
                        d.device_name,
                        list(d.cdi_device_ids),
                        d.share_id if d.HasField("share_id") else None,
                    )
                    for d in answer.devices
                ],
            )

    def _container_env(
        self,
        pod: Mapping[str, Any],
        names: Mapping[str, str],
        ext: Mapping[str, Any],
        claims: Mapping[str, dict[str, Any]],
    ) -> dict[str, list[str]]:
        spec = pod.get("spec") or {}
        out: dict[str, list[str]] = {}

        def devices(claim_name: str, request: str | None) -> list[PreparedDevice]:
            prepared = self.prepared[claims[claim_name]["metadata"]["uid"]]
            return [
                d
                for d in prepared.devices
                # kubelet's cdiDevicesAsList: an exact match (drivers answer a
                # firstAvailable result by its main request); no names: every request
                if request is None or not d.request_names or request in d.request_names
            ]

        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            ids: list[str] = []
            for ref in (c.get("resources") or {}).get("claims") or []:
                claim_name = names.get(ref.get("name"))
                if claim_name is None:
                    continue
                # kubelet's cdiDevicesAsList: in the answer's order, not deduplicated
                for d in devices(claim_name, ref.get("request") or None):
                    ids += d.cdi_ids
            for m in ext.get("requestMappings") or []:
                if m.get("containerName") == c["name"]:
                    for d in devices(ext["resourceClaimName"], m.get("requestName")):
                        ids += d.cdi_ids
            if ids:
                out[c["name"]] = self.cdi.env(ids)
        return out

    # ------------------------------------------------------------------ unprepare

    async def release(self, pod_uid: str) -> None:
        """The pod is gone: unprepare the claims no other pod on the node uses."""
        by_driver: dict[str, list[PreparedClaim]] = {}
        for claim in self.prepared.values():
            if pod_uid in claim.pods:
                claim.pods.discard(pod_uid)
                if not claim.pods:
                    by_driver.setdefault(claim.driver, []).append(claim)
        for driver, group in by_driver.items():
            plugin = self.plugins.get(driver)
            uids = [c.uid for c in group]
            self.unprepare_calls.append((driver, uids))
            if plugin is None:
                log.warning("%s: cannot unprepare %s: driver %s gone", self.node_name, uids, driver)
                continue
            channel = Channel(path=plugin.endpoint)
            try:
                resp = await dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                    dra_pb2.NodeUnprepareResourcesRequest(
                        claims=[
                            dra_pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name)
                            for c in group
                        ]
                    ),
                    timeout=45,
                )
            except Exception as exc:
                log.warning(
                    "%s: NodeUnprepareResources for %s failed: %r", self.node_name, uids, exc
                )
                continue
            finally:
                channel.close()
            for c in group:
                answer = resp.claims.get(c.uid)
                if answer is not None and answer.error:
                    log.warning("%s: unprepare %s: %s", self.node_name, c.name, answer.error)
                    continue
                self.prepared.pop(c.uid, None)
