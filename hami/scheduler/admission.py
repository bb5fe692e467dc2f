"""The webhook's answer when both device modes may serve the API server (docs/dra.md).

``Admission.review`` is the webhook's entry: a pod that asks for no device, or that another
scheduler places, or whose namespace runs in the extender mode (``devicemode``) gets the
extender path's answer unchanged (``webhook.review``). A device pod in a DRA-mode namespace
is turned into a claim (``dramutate``): the ResourceClaimTemplate is created (or found:
its name is its content's hash) before the pod is admitted, so the resourceclaim
controller finds it; a dry run creates nothing (``sideEffects: NoneOnDryRun``).

Reads: the pod's Namespace (its labels, cached a few seconds) and, for a memory percentage,
hami's ResourceSlices (the device sizes). Writes: ResourceClaimTemplates. A read or write
that fails refuses the pod with the reason (the client retries); nothing is dropped.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami import log
from hami.core.requests import DeviceKind, RequestError, asks_for
from hami.dra.inventory import slice_devices
from hami.dra.names import driver_name
from hami.kube.client import Kube
from hami.kube.raw import Conflict, KubeError, Unreachable
from hami.protocol.objects import pod_containers
from hami.scheduler import dramutate
from hami.scheduler.devicemode import DRA, DeviceModeError, mode_of
from hami.scheduler.webhook import PodDenied, for_hami, forged_keys, pod_ref, review

_log = log.get(__name__)
RESOURCE_API = "/apis/resource.k8s.io/v1"
NAMESPACE_TTL = 5.0  # seconds a namespace's labels are trusted: a relabel takes this long


class Admission:
    """The webhook with the mode decision; ``kube`` reads namespaces and slices and creates
    templates."""

    def __init__(
        self,
        kube: Kube,
        kinds: Sequence[DeviceKind],
        scheduler_name: str,
        *,
        runtime_class: str = "",
        default_mode: str = "extender",
        route_cpu_pods: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.kinds = list(kinds)
        self.scheduler_name = scheduler_name
        self.runtime_class = runtime_class
        self.default_mode = default_mode
        self.route_cpu_pods = route_cpu_pods
        self._clock = clock
        self._labels: dict[str, tuple[float, Mapping[str, str]]] = {}

    def extender_review(self, body: Any) -> dict[str, Any]:
        return review(
            body,
            self.kinds,
            self.scheduler_name,
            self.runtime_class,
            route_cpu_pods=self.route_cpu_pods,
        )

    async def review(self, body: Any) -> dict[str, Any]:
        """An AdmissionReview request -> the AdmissionReview response."""
        request = body.get("request") if isinstance(body, Mapping) else None
        pod = request.get("object") if isinstance(request, Mapping) else None
        if not isinstance(request, Mapping) or not isinstance(pod, Mapping):
            return self.extender_review(body)
        if (request.get("kind") or {}).get("kind", "Pod") != "Pod":
            return self.extender_review(body)
        if not any(asks_for(c, self.kinds) for c in pod_containers(pod)[0]):
            return self.extender_review(body)
        if not for_hami(pod, self.scheduler_name):
            return self.extender_review(body)
        namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace"))
        response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
        try:
            mode = mode_of(namespace, await self._namespace_labels(namespace), self.default_mode)
        except DeviceModeError as exc:
            return _answer(body, _deny(response, 400, "BadRequest", str(exc)))
        except (KubeError, Unreachable) as exc:
            message = (
                f"pod {pod_ref(pod)}: cannot read namespace {namespace} to choose its device "
                f"mode (label hami.io/device-mode): {exc}; retry"
            )
            return _answer(body, _deny(response, 500, "InternalError", message))
        if mode != DRA or not await self._dra(
            response, pod, namespace, bool(request.get("dryRun"))
        ):
            return self.extender_review(body)
        return _answer(body, response)

    async def _dra(
        self, response: dict[str, Any], pod: Mapping[str, Any], namespace: str, dry_run: bool
    ) -> bool:
        """Fill ``response`` for a DRA-mode pod; False when it asks no device after all."""
        try:
            types = dramutate.percent_types(pod, self.kinds)
            sizes = {t: await self._sizes(t) for t in sorted(types)}
            conversion = dramutate.convert(
                pod, self.kinds, self.scheduler_name, self.runtime_class, sizes
            )
        except RequestError as exc:
            _deny(response, 400, "BadRequest", str(exc))
            return True
        except PodDenied as exc:
            _deny(response, 403, "Forbidden", str(exc))
            return True
        except (KubeError, Unreachable) as exc:
            message = f"pod {pod_ref(pod)}: cannot read hami's ResourceSlices: {exc}; retry"
            _deny(response, 500, "InternalError", message)
            return True
        if conversion is None:
            return False
        if not dry_run:
            try:
                await self._ensure_template(namespace, conversion.template)
            except (KubeError, Unreachable) as exc:
                message = (
                    f"pod {pod_ref(pod)}: cannot create ResourceClaimTemplate "
                    f"{namespace}/{conversion.template_name} for its devices: {exc}; retry"
                )
                _deny(response, 500, "InternalError", message)
                return True
        warnings = list(conversion.warnings)
        forged = forged_keys(pod, self.kinds)
        if forged:
            warnings.append(
                f"hami removed {', '.join(forged)} from pod {pod_ref(pod)}: only hami's "
                "scheduler and node agent write these annotations"
            )
        if warnings:
            response["warnings"] = warnings
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(conversion.ops).encode()).decode()
        _log.info(
            "pod turned into a claim",
            pod=pod_ref(pod),
            template=conversion.template_name,
            dry_run=dry_run,
        )
        return True

    async def _namespace_labels(self, namespace: str) -> Mapping[str, str]:
        now = self._clock()
        cached = self._labels.get(namespace)
        if cached is not None and now - cached[0] < NAMESPACE_TTL:
            return cached[1]
        body = await self.kube.request("GET", f"/api/v1/namespaces/{namespace}")
        labels = (body.get("metadata") or {}).get("labels") or {}
        labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
        if len(self._labels) > 4096:  # namespaces come and go: never grow without bound
            self._labels.clear()
        self._labels[namespace] = (now, labels)
        return labels

    async def _sizes(self, type_word: str) -> list[int]:
        """The device sizes (MiB) the driver's ResourceSlices publish."""
        driver = driver_name(type_word)
        items, _ = await self.kube.list_all(
            f"{RESOURCE_API}/resourceslices", query=[("fieldSelector", f"spec.driver={driver}")]
        )
        sizes: set[int] = set()
        for item in items:
            devices = slice_devices(item, {driver: type_word})
            if devices is not None:
                sizes.update(d.memory for d in devices.devices if d.memory > 0)
        return sorted(sizes)

    async def _ensure_template(self, namespace: str, template: Mapping[str, Any]) -> None:
        path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"
        try:
            await self.kube.create(path, template)
        except Conflict:
            return  # made for an earlier pod of the same shape: its name is its content
        except KubeError as exc:
            if exc.status != 409:
                raise


def _deny(response: dict[str, Any], code: int, reason: str, message: str) -> dict[str, Any]:
    response["allowed"] = False
    response["status"] = {"code": code, "reason": reason, "message": message}
    _log.info("pod denied", error=message)
    return response


def _answer(body: Any, response: dict[str, Any]) -> dict[str, Any]:
    version = body.get("apiVersion") if isinstance(body, Mapping) else None
    return {
        "apiVersion": version or "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }
