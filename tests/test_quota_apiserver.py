"""What kube-apiserver itself does with device quotas (docs/operations.md "Quotas").

Go HAMi's quota keys are ``limits.nvidia.com/gpumem`` and ``limits.nvidia.com/gpucores``.
Kubernetes tracks extended resources in quotas only as ``requests.<name>``; these tests pin
that the API server stores a ``limits.`` key but never enforces it, so the scheduler must,
and that a ``requests.`` key is enforced by the API server on the pod spec alone.

The test control plane runs no kube-controller-manager, so the quota controller's part
(copying ``spec.hard`` into ``status.hard`` with zero ``used``) is done here by hand, as
the controller would do it before the first pod.
"""

from __future__ import annotations

from typing import Any

import pytest
from _sched_helpers import create_pod, gpu_pod

from hami.kube.client import Kube
from hami.kube.raw import KubeError


async def make_quota(
    kube: Kube, namespace: str, name: str, hard: dict[str, str], *, used: bool = True
) -> None:
    path = f"/api/v1/namespaces/{namespace}/resourcequotas"
    body = {"metadata": {"name": name}, "spec": {"hard": hard}}
    created: dict[str, Any] = await kube.create(path, body)
    # The quota controller's first sync: status.hard = spec.hard, nothing used yet (or,
    # used=False, no used value at all for keys no quota evaluator computes).
    status = {"hard": hard, "used": {key: "0" for key in hard} if used else {}}
    created["status"] = status
    await kube.request("PUT", f"{path}/{name}/status", body=created)


@pytest.mark.parametrize("used", [True, False])
async def test_limits_keys_are_stored_but_not_enforced(
    kube: Kube, namespace: str, used: bool
) -> None:
    hard = {"limits.nvidia.com/gpumem": "1000", "limits.nvidia.com/gpucores": "0"}
    await make_quota(kube, namespace, "gpu", hard, used=used)
    stored = await kube.request("GET", f"/api/v1/namespaces/{namespace}/resourcequotas/gpu")
    # Kept, in the API server's canonical form ("1000" comes back as "1k").
    assert stored["spec"]["hard"] == {
        "limits.nvidia.com/gpumem": "1k",
        "limits.nvidia.com/gpucores": "0",
    }
    # 3000 MiB and 50 % asked against limits of 1000 and 0: admitted all the same.
    pod = await create_pod(kube, namespace, gpu_pod("over", mem=3000, cores=50))
    assert pod["metadata"]["name"] == "over"


async def test_requests_keys_are_enforced_on_the_pod_spec(kube: Kube, namespace: str) -> None:
    await make_quota(kube, namespace, "gpu", {"requests.nvidia.com/gpumem": "1000"})
    with pytest.raises(KubeError) as caught:
        await create_pod(kube, namespace, gpu_pod("over", mem=3000))
    assert caught.value.status == 403
    assert "exceeded quota" in str(caught.value)
