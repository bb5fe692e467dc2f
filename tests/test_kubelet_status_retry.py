"""The kubelet emulator retries a pod status write that failed (issue 9 item 4), as
kubelet's status manager does, instead of leaving an admitted pod Pending for ever."""

from __future__ import annotations

import uuid
from typing import Any

from hami.kube.client import Kube
from hami.kube.raw import KubeError, Unreachable
from hami.testkit.cluster import poll
from hami.testkit.kubelet import KubeletEmulator, PodAdmission


async def test_a_failed_status_write_is_retried(
    kubelet_factory: Any, kube: Kube, namespace: str
) -> None:
    node = f"n-st-{uuid.uuid4().hex[:6]}"
    kubelet: KubeletEmulator = await kubelet_factory(node, status_retry=(0.05, 0.2))
    original = kubelet._patch_status
    path = f"/api/v1/namespaces/{namespace}/pods/p/status"
    failures = [
        KubeError(503, "Service Unavailable", "apiserver restarting", path),
        Unreachable("connection reset", path, sent=True),
    ]

    async def flaky(adm: PodAdmission, status: dict[str, Any]) -> None:
        if failures:
            raise failures.pop(0)
        await original(adm, status)

    kubelet._patch_status = flaky  # type: ignore[method-assign]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": namespace},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    }
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
    admission = await kubelet.wait_for_admission(namespace, "p", timeout=20)
    assert admission.phase == "Running" and not failures

    async def running() -> bool:
        pod = await kube.get_pod(namespace, "p")
        return bool(pod.get("status", {}).get("phase") == "Running")

    await poll(running, 10, "pod Running after two failed status writes")
