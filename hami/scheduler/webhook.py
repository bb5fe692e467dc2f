"""The mutating admission webhook (AdmissionReview v1) and its reloading TLS context.

For every pod it is called for (CREATE), the webhook

- removes the scheduler's decision annotations a user wrote (``hami.io/vgpu-node``,
  ``vgpu-time``, ``bind-time``, ``bind-phase``, every backend's ``*-devices-allocated`` and
  ``*-devices-to-allocate``): only hami's roles write them, so a pod cannot steer the node
  agent with forged ones, whether or not it asks for a device. Removing (with a warning to
  the client) rather than denying keeps controllers that copy a template working.

For a pod that asks for a resource hami manages, it also

- denies a pod that sets ``spec.nodeName`` (it would bypass the scheduler and its
  reservation) and a privileged container asking for a shared device (it sees every
  device of the node, so its share cannot be enforced), saying what to fix;
- leaves it as it is (but for the removal above) when it names another scheduler than the
  default or hami's, as Go HAMi does;
- sets ``spec.schedulerName`` to hami's scheduler;
- fills what Go HAMi's webhook fills, so that pods written for Go HAMi run the same here:
  the count (``scheduler.default_device_count``, 1) for a container that names only
  memory, percentage or cores; cores ``100`` (the whole device) for a count with neither
  memory nor cores, or with ``gpumem-percentage: 100``; ``CUDA_TASK_PRIORITY`` in the env of
  a container with a ``nvidia.com/priority`` limit; ``spec.runtimeClassName``
  (``scheduler.webhook.runtime_class_name``, Go HAMi's ``devicePlugin.runtimeClassName``)
  on a pod asking for an NVIDIA device that names no RuntimeClass;
- denies a request the scheduler could never accept, saying what to fix.

docs/interop.md "Webhook" lists where it still differs from Go HAMi's, and why.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from hami import log
from hami.backends.hamicore import TASK_PRIORITY_ENV
from hami.core.noderesources import pod_requests
from hami.core.requests import (
    NO_ANNOTATIONS,
    DeviceKind,
    RequestError,
    asks_for,
    container_resources,
    parse_device_request,
    parse_pod,
    parse_quantity,
)
from hami.protocol import keys
from hami.protocol.objects import annotations_of, pod_containers

_log = log.get(__name__)
DEFAULT_SCHEDULER = "default-scheduler"
# The backend whose pods get scheduler.webhook.runtime_class_name (Go HAMi sets its
# devicePlugin.runtimeClassName only on pods asking for NVIDIA devices).
RUNTIME_CLASS_TYPE = "nvidia"

# Pod annotations only hami's roles write (protocol.md section 3).
_DECISION_KEYS = frozenset({keys.VGPU_NODE, keys.VGPU_TIME, keys.BIND_TIME, keys.BIND_PHASE})
_DECISION_SUFFIXES = ("-devices-allocated", "-devices-to-allocate")


class PodDenied(ValueError):
    """A pod hami must not admit; the message names the pod and the fix."""


def escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def is_decision_key(key: str, kinds: Sequence[DeviceKind]) -> bool:
    """Whether ``key`` is a scheduler decision: the fixed keys, every configured backend's
    device keys, and any ``hami.io/*-devices-(allocated|to-allocate)`` key (a backend this
    scheduler does not run may still run on a node)."""
    if key in _DECISION_KEYS:
        return True
    if any(key in (kind.allocated_key, kind.to_allocate_key) for kind in kinds):
        return True
    return key.startswith(keys.PREFIX) and key.endswith(_DECISION_SUFFIXES)


def forged_keys(pod: Mapping[str, Any], kinds: Sequence[DeviceKind]) -> list[str]:
    """The decision annotations a pod was created with, sorted."""
    return sorted(key for key in annotations_of(pod) if is_decision_key(key, kinds))


def pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName') or ''}<generated>"
    return f"{meta.get('namespace') or 'default'}/{name}"


def check_placement(pod: Mapping[str, Any], kinds: Sequence[DeviceKind]) -> None:
    """Deny what would let a managed pod escape the scheduler's accounting."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        raise PodDenied(
            f"pod {pod_ref(pod)} asks for a device hami shares and sets spec.nodeName={node}, "
            "which skips the scheduler that reserves the device; remove spec.nodeName and "
            f"pin the node with nodeSelector kubernetes.io/hostname: {node} instead"
        )
    containers, _ = pod_containers(pod)
    for container in containers:
        context = container.get("securityContext") or {}
        if context.get("privileged") is True and asks_for(container, kinds):
            raise PodDenied(
                f"pod {pod_ref(pod)}: container {container.get('name')} is privileged and "
                "asks for a shared device; a privileged container sees every device of the "
                "node, so its share cannot be enforced; drop securityContext.privileged or "
                "do not request a shared device"
            )


def strip_ops(forged: Sequence[str]) -> list[dict[str, Any]]:
    return [{"op": "remove", "path": f"/metadata/annotations/{escape(k)}"} for k in forged]


def for_hami(pod: Mapping[str, Any], scheduler_name: str) -> bool:
    """Whether the pod is left to hami's scheduler: no scheduler named, the default one
    (replaced, as Go HAMi's ``--force-overwrite-default-scheduler`` does) or hami's."""
    current = (pod.get("spec") or {}).get("schedulerName")
    return not current or current in (DEFAULT_SCHEDULER, scheduler_name)


def mutations(
    pod: Mapping[str, Any],
    kinds: Sequence[DeviceKind],
    scheduler_name: str,
    runtime_class: str = "",
    *,
    route_cpu_pods: bool = False,
) -> list[dict[str, Any]]:
    """JSON patch operations for a pod (empty when there is nothing to change).

    With ``route_cpu_pods`` (scheduler.defrag_cpu_pods) a pod that asks for no device but
    requests CPU or memory is routed to hami's scheduler as well, which places it where it
    strands the least GPU.

    Raises RequestError for an invalid request and PodDenied for a pod hami must not admit.
    """
    ops = strip_ops(forged_keys(pod, kinds))
    containers, init_count = pod_containers(pod)
    if not any(asks_for(c, kinds) for c in containers):
        current = (pod.get("spec") or {}).get("schedulerName")
        if (
            route_cpu_pods
            and for_hami(pod, scheduler_name)
            and current != scheduler_name
            and any(pod_requests(pod))
        ):
            ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
        return ops
    if not for_hami(pod, scheduler_name):
        # Another scheduler's pod is not hami's to fill in or judge (Go HAMi leaves it as is).
        return ops
    check_placement(pod, kinds)
    parse_pod(pod, kinds)  # raises RequestError with what to fix
    if (pod.get("spec") or {}).get("schedulerName") != scheduler_name:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    ops += runtime_class_ops(pod, kinds, runtime_class)
    for position, container in enumerate(containers):
        if position < init_count:
            base = f"/spec/initContainers/{position}"
        else:
            base = f"/spec/containers/{position - init_count}"
        ops += container_defaults(container, base, kinds, annotations_of(pod))
    return ops


def runtime_class_ops(
    pod: Mapping[str, Any], kinds: Sequence[DeviceKind], runtime_class: str
) -> list[dict[str, Any]]:
    """Set the RuntimeClass GPU containers need (e.g. nvidia, where the node's default
    runtime does not expose the driver), unless the pod chose one itself."""
    if not runtime_class or (pod.get("spec") or {}).get("runtimeClassName"):
        return []
    gpu_kinds = [kind for kind in kinds if kind.type_word == RUNTIME_CLASS_TYPE]
    containers, _ = pod_containers(pod)
    if not any(asks_for(c, gpu_kinds) for c in containers):
        return []
    return [{"op": "add", "path": "/spec/runtimeClassName", "value": runtime_class}]


def container_defaults(
    container: Mapping[str, Any],
    base: str,
    kinds: Sequence[DeviceKind],
    annotations: Mapping[str, str] = NO_ANNOTATIONS,
) -> list[dict[str, Any]]:
    """What Go HAMi's webhook fills into one container (``base`` is its JSON pointer;
    ``annotations`` are the pod's)."""
    resources = container.get("resources") or {}
    sections = {s: dict(resources.get(s) or {}) for s in ("limits", "requests")}
    ops: list[dict[str, Any]] = []
    env: list[dict[str, str]] = []
    for kind in kinds:
        added = defaults(container_resources(container), kind, annotations)
        for name, value in added.items():
            ops += _add_resource(base, sections, name, value)
        priority = task_priority(container, kind)
        if priority is not None:
            env.append({"name": TASK_PRIORITY_ENV, "value": priority})
        env += kind_env(container, kind)
    if env and container.get("env"):
        ops += [{"op": "add", "path": f"{base}/env/-", "value": item} for item in env]
    elif env:
        ops.append({"op": "add", "path": f"{base}/env", "value": env})
    return ops


def defaults(
    resources: Mapping[str, Any],
    kind: DeviceKind,
    annotations: Mapping[str, str] = NO_ANNOTATIONS,
) -> dict[str, str]:
    """The resources of ``kind`` to add to (or rewrite in) a container asking for
    ``resources``; for a kind with its own request rules (Ascend) the count and memory of the
    request they derive (``written``), else:

    - the count (``kind.default_count``) when only memory, percentage or cores are named:
      kubelet calls the device plugin only for a container that names its resource, and
      without that call HAMi-core sets no limit at all;
    - cores ``100`` (the whole device) when the count is named without cores and without
      memory, or with ``memory percentage: 100``: such a container asked for the whole device.
    """
    if kind.request_rule is not None:
        return written(resources, kind, annotations)
    names = kind.resources
    added: dict[str, str] = {}
    share = (names.memory, names.memory_percentage, names.cores)
    has_count = names.count in resources
    if not has_count and any(name and name in resources for name in share):
        added[names.count] = str(kind.default_count)
        has_count = True
    if not has_count or names.cores is None or names.cores in resources:
        return added
    if kind.default_cores >= 100:
        return added  # absent cores already mean the whole device
    percentage = names.memory_percentage
    if percentage and percentage in resources:
        exclusive = _quantity(resources[percentage]) == 100
    else:
        exclusive = not (names.memory and names.memory in resources)
    if exclusive:
        added[names.cores] = "100"
    return added


def written(
    resources: Mapping[str, Any],
    kind: DeviceKind,
    annotations: Mapping[str, str] = NO_ANNOTATIONS,
) -> dict[str, str]:
    """The count and memory a kind's request rules derive, where they differ from what the
    container names, as Go HAMi's webhook writes them for Ascend (memory rounded up to its
    vNPU template, or the whole chip's; one 910C device made one 2-NPU module), so that the
    node's plug-in and kubelet see what the scheduler places."""
    request = parse_device_request(resources, kind, "container", annotations)
    if request is None:
        return {}
    names = kind.resources
    out: dict[str, str] = {}
    if _quantity(resources.get(names.count)) != request.count:
        out[names.count] = str(request.count)
    if names.memory and request.memory_percentage is None and kind.memory_reader is None:
        memory = request.memory // names.memory_unit_mib
        if kind.memory_per_container:
            memory *= request.count  # the resource holds all the devices' memory
        if names.memory not in resources or _quantity(resources[names.memory]) != memory:
            out[names.memory] = str(memory)
    if kind.cores_per_container and names.cores:
        cores = request.cores * request.count  # the resource holds all the devices' cores
        if _quantity(resources.get(names.cores, 0)) != cores:
            out[names.cores] = str(cores)
    return out


def kind_env(container: Mapping[str, Any], kind: DeviceKind) -> list[dict[str, str]]:
    """The environment a kind's backend has the webhook set (``DeviceKind.container_env``)
    in a container naming its count in limits, less what the container sets itself."""
    limits = (container.get("resources") or {}).get("limits") or {}
    if kind.container_env is None or kind.resources.count not in limits:
        return []
    present = {item.get("name") for item in container.get("env") or [] if isinstance(item, dict)}
    wanted = kind.container_env(container)
    return [{"name": k, "value": v} for k, v in wanted.items() if k not in present]


def task_priority(container: Mapping[str, Any], kind: DeviceKind) -> str | None:
    """``CUDA_TASK_PRIORITY`` for the container's priority limit, or None. Go HAMi's webhook
    writes it into the container (its device plugin does not), this project's node agent
    into its Allocate answer: the webhook writes it too, so either agent's node applies it."""
    name = kind.priority_resource
    limits = (container.get("resources") or {}).get("limits") or {}
    if not name or name not in limits:
        return None
    value = _quantity(limits[name])
    return None if value is None else str(value)


def _quantity(value: Any) -> int | None:
    try:
        return parse_quantity(value)
    except ValueError:
        return None  # parse_pod refused it already


def _add_resource(
    base: str,
    sections: dict[str, dict[str, Any]],
    name: str,
    value: str,
) -> list[dict[str, Any]]:
    """Add ``name: value`` to limits, and to requests when the container has requests (the
    API server copies limits into absent requests, so both stay equal either way)."""
    ops: list[dict[str, Any]] = []
    for section in ("limits", "requests"):
        if section == "requests" and not sections["requests"]:
            continue
        if not sections[section]:
            ops.append({"op": "add", "path": f"{base}/resources/{section}", "value": {}})
        path = f"{base}/resources/{section}/{escape(name)}"
        ops.append({"op": "add", "path": path, "value": value})
        sections[section][name] = value
    return ops


def review(
    body: Any,
    kinds: Sequence[DeviceKind],
    scheduler_name: str,
    runtime_class: str = "",
    *,
    route_cpu_pods: bool = False,
) -> dict[str, Any]:
    """An AdmissionReview request -> the AdmissionReview response."""
    request = body.get("request") if isinstance(body, Mapping) else None
    if not isinstance(request, Mapping):
        request = {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    pod = request.get("object")
    kind = (request.get("kind") or {}).get("kind", "Pod")
    if isinstance(pod, Mapping) and kind == "Pod":
        _answer(response, pod, kinds, scheduler_name, runtime_class, route_cpu_pods)
    return {
        "apiVersion": body.get("apiVersion", "admission.k8s.io/v1")
        if isinstance(body, Mapping)
        else "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }


def _answer(
    response: dict[str, Any],
    pod: Mapping[str, Any],
    kinds: Sequence[DeviceKind],
    scheduler_name: str,
    runtime_class: str = "",
    route_cpu_pods: bool = False,
) -> None:
    try:
        ops = mutations(pod, kinds, scheduler_name, runtime_class, route_cpu_pods=route_cpu_pods)
    except RequestError as exc:
        _deny(response, 400, "BadRequest", str(exc))
        return
    except PodDenied as exc:
        _deny(response, 403, "Forbidden", str(exc))
        return
    warnings: list[str] = []
    forged = forged_keys(pod, kinds)
    if forged:
        warnings.append(
            f"hami removed {', '.join(forged)} from pod {pod_ref(pod)}: only hami's "
            "scheduler and node agent write these annotations"
        )
        _log.warning("forged decision annotations removed", pod=pod_ref(pod), keys=forged)
    managed = any(asks_for(c, kinds) for c in pod_containers(pod)[0])
    managed = managed and for_hami(pod, scheduler_name)
    request = parse_pod(pod, kinds) if managed else None  # parsed fine in mutations()
    if request is not None:
        # A policy or weights value not understood: admitted, scheduled by the default.
        warnings += [f"pod {pod_ref(pod)}: {message}" for message in request.warnings]
    if warnings:
        response["warnings"] = warnings
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()


def _deny(response: dict[str, Any], code: int, reason: str, message: str) -> None:
    response["allowed"] = False
    response["status"] = {"code": code, "reason": reason, "message": message}
    _log.info("pod denied", error=message)


class WebhookTLSError(ValueError):
    """The webhook's certificate or key cannot be loaded at start-up."""


class ReloadingTLS:
    """A server SSL context whose certificate follows the files on disk.

    ``maybe_reload()`` (called periodically by the role) reloads the chain when either
    file's mtime or size changed; new connections use the new certificate. A broken pair
    is logged and the previous certificate kept.
    """

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            self._stamp = self._read_stamp()
            self.context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise WebhookTLSError(
                f"webhook TLS: cannot load certificate {cert_file} with key {key_file}: "
                f"{exc}; mount the serving certificate there (scheduler.webhook.cert_file, "
                "key_file) or set scheduler.webhook.enabled: false"
            ) from exc
        self.reloads = 0

    def _read_stamp(self) -> tuple[float, int, float, int]:
        cert = os.stat(self.cert_file)
        key = os.stat(self.key_file)
        return (cert.st_mtime, cert.st_size, key.st_mtime, key.st_size)

    def maybe_reload(self, force: bool = False) -> bool:
        """Reload if the files changed (or ``force``: the caller knows they did, e.g. the
        self-provisioned certificate, whose rewrite could keep mtime and size)."""
        try:
            stamp = self._read_stamp()
        except OSError as exc:
            _log.warning("webhook certificate unreadable, keeping the old one", error=str(exc))
            return False
        if stamp == self._stamp and not force:
            return False
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            _log.error(
                "webhook certificate reload failed, keeping the old one",
                cert=self.cert_file,
                key=self.key_file,
                error=str(exc),
            )
            return False
        self._stamp = stamp
        self.reloads += 1
        _log.info("webhook certificate reloaded", cert=self.cert_file)
        return True
