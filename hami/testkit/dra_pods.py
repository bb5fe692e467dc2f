"""ResourceClaimTemplates and pods for the DRA mode (docs/dra.md "Requests"). Pure.

The shapes the extender mode writes as ``nvidia.com/*`` limits, written as DRA requests
against the DeviceClass a hami node agent in ``mode: dra`` publishes:

    claim_template("t3000", mem=3000)                  # one slice of 3000 MiB
    claim_template("half", mem=None, cores=30)         # default memory: the whole device
    claim_template("two", count=2, mem=8000)           # 2 different devices x 8000 MiB
    claim_template("t4", mem=1000, model="T4")         # CEL: the model attribute contains T4
    dra_pod("p", ["t3000"])                            # container c0 uses the claim

A percentage of a device's memory has no DRA form (capacity requests are amounts); for a
known set of models ``percent_template`` writes it as a prioritised list (firstAvailable)
of per-model amounts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

RESOURCE_API = "/apis/resource.k8s.io/v1"
DEFAULT_CLASS = "nvidia.hami.io"


def model_expression(model: str, device_class: str = DEFAULT_CLASS) -> str:
    """CEL: the device's model contains ``model`` (as ``nvidia.com/use-gputype`` matches);
    the driver's attributes are qualified by its name."""
    return f'device.attributes["{device_class}"].model.contains("{model}")'


def _exact(
    device_class: str,
    count: int,
    mem: int | None,
    cores: int | None,
    model: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": device_class}
    if count != 1:
        body["allocationMode"] = "ExactCount"
        body["count"] = count
    requests: dict[str, str] = {}
    if mem is not None:
        requests["memory"] = f"{mem}Mi"
    if cores is not None:
        requests["cores"] = str(cores)
    if requests:
        body["capacity"] = {"requests": requests}
    if model is not None:
        body["selectors"] = [{"cel": {"expression": model_expression(model, device_class)}}]
    return body


def claim_spec(
    *,
    count: int = 1,
    mem: int | None = None,
    cores: int | None = None,
    model: str | None = None,
    device_class: str = DEFAULT_CLASS,
) -> dict[str, Any]:
    """A ResourceClaim spec with one request ``gpu`` (``count`` distinct devices)."""
    devices: dict[str, Any] = {
        "requests": [{"name": "gpu", "exactly": _exact(device_class, count, mem, cores, model)}]
    }
    if count > 1:
        # a shared device may otherwise serve the same request twice
        devices["constraints"] = [
            {"requests": ["gpu"], "distinctAttribute": f"{device_class}/uuid"}
        ]
    return {"devices": devices}


def claim_template(
    name: str,
    *,
    count: int = 1,
    mem: int | None = None,
    cores: int | None = None,
    model: str | None = None,
    device_class: str = DEFAULT_CLASS,
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": claim_spec(
                count=count, mem=mem, cores=cores, model=model, device_class=device_class
            )
        },
    }


def percent_template(
    name: str,
    models: Mapping[str, int],
    percent: int,
    *,
    cores: int | None = None,
    device_class: str = DEFAULT_CLASS,
) -> dict[str, Any]:
    """``percent`` % of the memory of whichever of ``models`` (model -> MiB) is free, as a
    prioritised list: kube-scheduler takes the first subrequest it can satisfy."""
    subrequests = [
        {
            "name": f"m{i}",
            **_exact(device_class, 1, total * percent // 100, cores, model),
        }
        for i, (model, total) in enumerate(models.items())
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": subrequests}]}}
        },
    }


def dra_pod(
    name: str,
    templates: Sequence[str],
    *,
    scheduler_name: str | None = "hami-scheduler",
    node_selector: Mapping[str, str] | None = None,
    init: Sequence[str] = (),
) -> dict[str, Any]:
    """A pod whose container ``c{i}`` uses a claim made from ``templates[i]`` (and init
    container ``init{i}`` one from ``init[i]``)."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": f"c{i}",
                "image": "busybox",
                "resources": {"claims": [{"name": f"gpu{i}"}]},
            }
            for i in range(len(templates))
        ],
        "resourceClaims": [
            {"name": f"gpu{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)
        ]
        + [{"name": f"init{i}", "resourceClaimTemplateName": t} for i, t in enumerate(init)],
        "terminationGracePeriodSeconds": 0,
    }
    if init:
        spec["initContainers"] = [
            {
                "name": f"init{i}",
                "image": "busybox",
                "resources": {"claims": [{"name": f"init{i}"}]},
            }
            for i in range(len(init))
        ]
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def templates_path(namespace: str) -> str:
    return f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"


def claims_path(namespace: str) -> str:
    return f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
