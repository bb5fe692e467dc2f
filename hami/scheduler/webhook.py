"""The mutating admission webhook (AdmissionReview v1) and its reloading TLS context.

For a pod that asks for a resource hami manages, the webhook

- sets ``spec.schedulerName`` to hami's scheduler, unless a non-default scheduler is set;
- fills defaults: a count-only request (no memory, percentage or cores) gets the
  backend's cores resource at 100, the whole device;
- denies a request the scheduler could never accept, saying what to fix.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from hami import log
from hami.core.requests import DeviceKind, RequestError, asks_for, parse_pod
from hami.kube.objects import pod_containers

_log = log.get(__name__)
DEFAULT_SCHEDULER = "default-scheduler"


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def mutations(
    pod: Mapping[str, Any], kinds: Sequence[DeviceKind], scheduler_name: str
) -> list[dict[str, Any]] | None:
    """JSON patch operations for a managed pod, or None when hami does not manage it.

    Raises RequestError for an invalid request.
    """
    containers, init_count = pod_containers(pod)
    if not any(asks_for(c, kinds) for c in containers):
        return None
    parse_pod(pod, kinds)  # raises RequestError with what to fix
    ops: list[dict[str, Any]] = []
    spec = pod.get("spec") or {}
    current = spec.get("schedulerName")
    if not current or current == DEFAULT_SCHEDULER:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    for position, container in enumerate(containers):
        if position < init_count:
            base = f"/spec/initContainers/{position}/resources"
        else:
            base = f"/spec/containers/{position - init_count}/resources"
        resources = container.get("resources") or {}
        for kind in kinds:
            names = kind.resources
            if names.cores is None or kind.default_cores >= 100:
                continue
            for section in ("limits", "requests"):
                values = resources.get(section) or {}
                if names.count not in values:
                    continue
                extra = (names.memory, names.memory_percentage, names.cores)
                if any(name and name in values for name in extra):
                    continue
                ops.append(
                    {
                        "op": "add",
                        "path": f"{base}/{section}/{_escape(names.cores)}",
                        "value": "100",
                    }
                )
    return ops


def review(body: Any, kinds: Sequence[DeviceKind], scheduler_name: str) -> dict[str, Any]:
    """An AdmissionReview request -> the AdmissionReview response."""
    request = body.get("request") if isinstance(body, Mapping) else None
    if not isinstance(request, Mapping):
        request = {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    pod = request.get("object")
    kind = (request.get("kind") or {}).get("kind", "Pod")
    if isinstance(pod, Mapping) and kind == "Pod":
        try:
            ops = mutations(pod, kinds, scheduler_name)
        except RequestError as exc:
            response["allowed"] = False
            response["status"] = {"code": 400, "reason": "BadRequest", "message": str(exc)}
            _log.info("pod denied", error=str(exc))
        else:
            if ops:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {
        "apiVersion": body.get("apiVersion", "admission.k8s.io/v1")
        if isinstance(body, Mapping)
        else "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }


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

    def maybe_reload(self) -> bool:
        try:
            stamp = self._read_stamp()
        except OSError as exc:
            _log.warning("webhook certificate unreadable, keeping the old one", error=str(exc))
            return False
        if stamp == self._stamp:
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
