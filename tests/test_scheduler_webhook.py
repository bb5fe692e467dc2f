"""The mutating webhook: AdmissionReview v1 answers, and TLS served from files with reload."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import os
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _core_helpers import MLU, NVIDIA
from _jsonpatch import apply_patch
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hami import config
from hami.core.requests import parse_pod
from hami.kube.client import Kube
from hami.kube.raw import KubeError
from hami.scheduler.http import build_app
from hami.scheduler.role import device_kinds
from hami.scheduler.service import Scheduler
from hami.scheduler.webhook import ReloadingTLS, WebhookTLSError, review


def admission(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "object": pod,
        },
    }


def pod(limits: dict[str, str], scheduler: str | None = None, init: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if init:
        spec["initContainers"] = [{"name": "i"}]
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    response = answer["response"]
    assert response["allowed"] is True
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def test_count_only_gets_scheduler_and_whole_device() -> None:
    answer = review(admission(pod({"nvidia.com/gpu": "1"})), [NVIDIA, MLU], "hami-scheduler")
    assert answer["response"]["uid"] == "req-1"
    assert patch_of(answer) == [
        {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"},
        {
            "op": "add",
            "path": "/spec/containers/0/resources/limits/nvidia.com~1gpucores",
            "value": "100",
        },
    ]


def test_default_scheduler_is_replaced_other_kept_and_init_paths() -> None:
    ops = patch_of(
        review(
            admission(
                pod(
                    {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10"},
                    "default-scheduler",
                    init=True,
                )
            ),
            [NVIDIA],
            "mine",
        )
    )
    assert ops == [{"op": "add", "path": "/spec/schedulerName", "value": "mine"}]
    # another scheduler's pod is left as it is, as Go HAMi leaves it (not even judged)
    for limits in ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpumem": "10"}):
        body = admission(pod(limits, "volcano", init=True))
        assert patch_of(review(body, [NVIDIA], "mine")) == []
    body = admission(pod({"nvidia.com/gpucores": "150"}, "volcano"))
    assert patch_of(review(body, [NVIDIA], "mine")) == []
    # hami's own name, set by the pod: kept, and the defaults are filled
    ops = patch_of(review(admission(pod({"nvidia.com/gpu": "2"}, "mine")), [NVIDIA], "mine"))
    assert ops == [
        {
            "op": "add",
            "path": "/spec/containers/0/resources/limits/nvidia.com~1gpucores",
            "value": "100",
        }
    ]
    # MLU: absent vcore already means the whole card; nothing to add
    ops = patch_of(review(admission(pod({"cambricon.com/vmlu": "1"})), [MLU], "mine"))
    assert ops == [{"op": "add", "path": "/spec/schedulerName", "value": "mine"}]


def test_runtime_class_is_set_on_nvidia_pods_that_name_none() -> None:
    """scheduler.webhook.runtime_class_name (the chart's devicePlugin.runtimeClassName) on
    GPU pods, as Go HAMi's webhook sets it: never over the pod's own choice, never on pods
    of other backends or of other schedulers, nothing when unset."""
    runtime = {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"}

    def ops_for(body: dict[str, Any], runtime_class: str = "nvidia") -> list[dict[str, Any]]:
        return patch_of(review(admission(body), [NVIDIA, MLU], "mine", runtime_class))

    assert runtime in ops_for(pod({"nvidia.com/gpu": "1"}))
    assert runtime in ops_for(pod({"nvidia.com/gpumem": "1000"}))  # a share alone counts too
    stored = apply_patch(pod({"nvidia.com/gpu": "1"}), ops_for(pod({"nvidia.com/gpu": "1"})))
    assert stored["spec"]["runtimeClassName"] == "nvidia"
    own = pod({"nvidia.com/gpu": "1"})
    own["spec"]["runtimeClassName"] = "kata"
    assert not [op for op in ops_for(own) if op["path"] == "/spec/runtimeClassName"]
    assert runtime not in ops_for(pod({"nvidia.com/gpu": "1"}), runtime_class="")
    assert runtime not in ops_for(pod({"cambricon.com/vmlu": "1"}))
    assert ops_for(pod({"nvidia.com/gpu": "1"}, "volcano")) == []
    assert ops_for(pod({"cpu": "1"})) == []


def stored_after(body: dict[str, Any], kinds: list[Any]) -> dict[str, Any]:
    """The pod after the webhook's patch."""
    return apply_patch(body, patch_of(review(admission(body), kinds, "hami-scheduler")))


def test_share_without_count_gets_the_configured_count() -> None:
    """Memory, percentage or cores alone: without the count kubelet never calls Allocate and
    the container runs with no HAMi-core limit at all (Go HAMi's defaultGPUNum)."""
    kinds = device_kinds(config.from_mapping({}, env={}))
    for share in (
        {"nvidia.com/gpumem": "3000"},
        {"nvidia.com/gpumem-percentage": "50"},
        {"nvidia.com/gpucores": "30"},
    ):
        body = pod(share)
        body["spec"]["containers"][0]["resources"]["requests"] = dict(share)
        limits_and_requests = stored_after(body, kinds)["spec"]["containers"][0]["resources"]
        for section in ("limits", "requests"):
            assert limits_and_requests[section] == {**share, "nvidia.com/gpu": "1"}, share
    # the same in an init container; the count-only container beside it gets whole cores
    body = pod({"nvidia.com/gpu": "1"})
    body["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": dict(share)}}]
    after = stored_after(body, kinds)["spec"]
    assert after["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert after["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "100"
    # configurable; the scheduler reads a count-less request the same way
    cfg = config.from_mapping({"scheduler": {"default_device_count": 2}}, env={})
    kinds = device_kinds(cfg)
    after = stored_after(pod({"nvidia.com/gpumem": "1000"}), kinds)
    assert after["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    request = parse_pod(pod({"nvidia.com/gpumem": "1000"}), kinds)
    assert request is not None and request.containers[0][0].count == 2
    with pytest.raises(config.ConfigError, match=r"scheduler\.default_device_count"):
        config.from_mapping({"scheduler": {"default_device_count": 0}}, env={})


def test_whole_memory_percentage_is_exclusive_and_priority_reaches_the_env() -> None:
    kinds = device_kinds(config.from_mapping({}, env={}))
    full = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}
    limits = stored_after(pod(full), kinds)["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {**full, "nvidia.com/gpucores": "100"}
    half = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}
    assert stored_after(pod(half), kinds)["spec"]["containers"][0]["resources"]["limits"] == half
    body = pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10", "nvidia.com/priority": "1"})
    assert stored_after(body, kinds)["spec"]["containers"][0]["env"] == [
        {"name": "CUDA_TASK_PRIORITY", "value": "1"}
    ]
    body["spec"]["containers"][0]["env"] = [{"name": "A", "value": "b"}]
    assert stored_after(body, kinds)["spec"]["containers"][0]["env"] == [
        {"name": "A", "value": "b"},
        {"name": "CUDA_TASK_PRIORITY", "value": "1"},
    ]


def test_unmanaged_pods_are_untouched() -> None:
    assert patch_of(review(admission(pod({"cpu": "1"})), [NVIDIA], "x")) == []
    answer = review(
        {"request": {"uid": "u", "kind": {"kind": "Service"}, "object": {}}}, [NVIDIA], "x"
    )
    assert answer["response"] == {"uid": "u", "allowed": True}
    assert review("garbage", [NVIDIA], "x")["response"]["allowed"] is True


def test_invalid_requests_are_denied_with_what_to_fix() -> None:
    for limits, words in (
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "120"}, "between 1 and 100"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1.5"}, "whole number"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "200"}, "between 0 and 100"),
    ):
        response = review(admission(pod(limits)), [NVIDIA], "x")["response"]
        assert response["allowed"] is False
        assert words in response["status"]["message"]
        assert "ns/p" in response["status"]["message"]


FORGED = {
    "hami.io/vgpu-node": "node-a",
    "hami.io/vgpu-time": "1700000000",
    "hami.io/bind-time": "1700000000",
    "hami.io/bind-phase": "allocating",
    "hami.io/vgpu-devices-to-allocate": "GPU-other,NVIDIA,999999,100:;",
    "hami.io/vgpu-devices-allocated": "GPU-other,NVIDIA,999999,100:;",
    "hami.io/cambricon-mlu-devices-to-allocate": "MLU-0,MLU,1,100:;",
    # a backend this scheduler does not run: still a decision key
    "hami.io/ascend-devices-allocated": "x",
}
KEPT = {"hami.io/node-scheduler-policy": "binpack", "team": "a"}


def with_annotations(body: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    body["metadata"]["annotations"] = dict(annotations)
    return body


def removed(ops: list[dict[str, Any]]) -> set[str]:
    return {
        op["path"].removeprefix("/metadata/annotations/").replace("~1", "/")
        for op in ops
        if op["op"] == "remove"
    }


def test_forged_decisions_are_removed_from_every_pod_with_a_warning() -> None:
    # asks for no device at all: still cleaned, so the node agent never sees the keys
    for limits in ({"cpu": "1"}, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10"}):
        body = with_annotations(pod(limits), {**FORGED, **KEPT})
        answer = review(admission(body), [NVIDIA, MLU], "hami-scheduler")
        ops = patch_of(answer)
        assert removed(ops) == set(FORGED)
        (warning,) = answer["response"]["warnings"]
        assert "hami.io/vgpu-devices-to-allocate" in warning and "ns/p" in warning
        assert "team" not in warning and "node-scheduler-policy" not in warning
    # no forged key: no remove operation, no warning
    answer = review(admission(with_annotations(pod({"cpu": "1"}), KEPT)), [NVIDIA], "x")
    assert patch_of(answer) == [] and "warnings" not in answer["response"]


def test_managed_pod_with_node_name_is_denied_with_the_fix() -> None:
    body = pod({"nvidia.com/gpu": "1"})
    body["spec"]["nodeName"] = "node-a"
    response = review(admission(body), [NVIDIA], "x")["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert "ns/p" in message and "spec.nodeName=node-a" in message
    assert "nodeSelector" in message
    # a pod that asks for no managed device may set nodeName (hami does not manage it)
    plain = pod({"cpu": "1"})
    plain["spec"]["nodeName"] = "node-a"
    assert review(admission(plain), [NVIDIA], "x")["response"]["allowed"] is True


def test_privileged_container_asking_for_a_shared_device_is_denied() -> None:
    body = pod({"nvidia.com/gpu": "1"}, init=True)
    body["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    response = review(admission(body), [NVIDIA], "x")["response"]
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "container c is privileged" in message and "securityContext.privileged" in message
    # a privileged container that asks for no device is not hami's concern
    body = pod({"nvidia.com/gpu": "1"})
    body["spec"]["initContainers"] = [{"name": "i", "securityContext": {"privileged": True}}]
    assert review(admission(body), [NVIDIA], "x")["response"]["allowed"] is True
    body["spec"]["containers"][0]["securityContext"] = {"privileged": False}
    assert review(admission(body), [NVIDIA], "x")["response"]["allowed"] is True


def write_cert(directory: Path, common_name: str) -> tuple[Path, Path, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(pem)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path, pem


async def served_cn(port: int, ca: bytes) -> tuple[str, dict[str, Any]]:
    """The served certificate's common name, and the webhook's answer."""
    context = ssl.create_default_context(cadata=ca.decode())
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    peer = writer.get_extra_info("peercert")
    writer.close()
    cn = dict(x[0] for x in peer["subject"])["commonName"]
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"https://127.0.0.1:{port}/webhook",
            json=admission(pod({"nvidia.com/gpu": "1"})),
            ssl=context,
        ) as resp,
    ):
        body: dict[str, Any] = await resp.json()
    return cn, body


async def test_webhook_over_tls_reloads_changed_certificate(tmp_path: Path) -> None:
    cert, key, first = write_cert(tmp_path, "first")
    tls = ReloadingTLS(str(cert), str(key))
    assert tls.maybe_reload() is False
    cfg = config.from_mapping({}, env={})
    app = build_app(Scheduler(cfg.scheduler, [NVIDIA], None), "hami-scheduler", extender=False)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        cn, body = await served_cn(port, first)
        assert cn == "first"
        assert body["response"]["allowed"] is True and "patch" in body["response"]
        # a broken pair (key not yet written) keeps the old certificate
        cert.write_text("not a certificate")
        os.utime(cert, (1, 1))
        assert tls.maybe_reload() is False
        assert (await served_cn(port, first))[1]["response"]["allowed"] is True
        # the rotated pair is picked up by the next check
        _, _, second = write_cert(tmp_path, "second")
        assert tls.maybe_reload() is True
        assert tls.reloads == 1
        await asyncio.sleep(0)
        try:
            await served_cn(port, first)
        except (aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError):
            pass
        else:
            raise AssertionError("the old certificate is still served")
        cn, body = await served_cn(port, second)
        assert cn == "second"
        assert body["response"]["uid"] == "req-1"
    finally:
        await runner.cleanup()


def test_missing_certificate_names_the_files_and_the_fix(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    with pytest.raises(WebhookTLSError) as excinfo:
        ReloadingTLS(str(cert), str(key))
    message = str(excinfo.value)
    assert str(cert) in message and str(key) in message
    assert "scheduler.webhook.enabled: false" in message
    cert.write_text("not a certificate")
    key.write_text("not a key")
    with pytest.raises(WebhookTLSError, match="cannot load certificate"):
        ReloadingTLS(str(cert), str(key))


@contextlib.asynccontextmanager
async def webhook_for(controlplane: Any, kube: Kube, namespace: str, workdir: Path) -> Any:
    """The webhook served over TLS and registered with the API server for one namespace."""
    cert, key = controlplane.ca.issue("hami-webhook", hosts=["127.0.0.1"], server=True)
    (workdir / "tls.crt").write_bytes(cert)
    (workdir / "tls.key").write_bytes(key)
    tls = ReloadingTLS(str(workdir / "tls.crt"), str(workdir / "tls.key"))
    cfg = config.from_mapping({}, env={})
    app = build_app(Scheduler(cfg.scheduler, [NVIDIA], None), "hami-scheduler", extender=False)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context).start()
    port = runner.addresses[0][1]
    name = f"hami-webhook-{namespace}"
    configurations = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    registration = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "pods.hami.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/webhook",
                    "caBundle": base64.b64encode(controlplane.ca.cert_pem).decode(),
                },
                # the rules of docker/manifests/50-webhook.yaml, for this namespace only
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            }
        ],
    }
    await kube.request("POST", configurations, body=registration)
    try:
        yield
    finally:
        with contextlib.suppress(KubeError):
            await kube.request("DELETE", f"{configurations}/{name}")
        await runner.cleanup()


async def create_pod(kube: Kube, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "Pod", **body}
    body["metadata"] = {**body["metadata"], "namespace": namespace}
    for container in body["spec"]["containers"] + body["spec"].get("initContainers", []):
        container.setdefault("image", "busybox")
    created: dict[str, Any] = await kube.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods", body=body
    )
    return created


async def test_admission_chain_cleans_forged_pods_and_denies_bypasses(
    controlplane: Any, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    async with webhook_for(controlplane, kube, namespace, tmp_path):
        # The registration takes effect within a moment: wait for the first patched pod.
        async with asyncio.timeout(20):
            while True:
                probe = pod({"nvidia.com/gpu": "1"})
                probe["metadata"] = {"generateName": "probe-"}
                created = await create_pod(kube, namespace, probe)
                if created["spec"].get("schedulerName") == "hami-scheduler":
                    break
                await asyncio.sleep(0.2)
        # no device asked for, forged decisions: stored without them
        plain = with_annotations(pod({"cpu": "100m"}), {**FORGED, **KEPT})
        plain["metadata"]["name"] = "forged-plain"
        plain["spec"]["nodeName"] = "node-a"
        stored = await create_pod(kube, namespace, plain)
        assert stored["metadata"]["annotations"] == KEPT
        managed = with_annotations(pod({"nvidia.com/gpu": "1"}), FORGED)
        managed["metadata"]["name"] = "forged-managed"
        stored = await create_pod(kube, namespace, managed)
        assert not stored["metadata"].get("annotations")
        assert stored["spec"]["schedulerName"] == "hami-scheduler"
        # bypassing the scheduler and privileged sharing are refused, saying why
        bypass = pod({"nvidia.com/gpu": "1"})
        bypass["metadata"]["name"] = "bypass"
        bypass["spec"]["nodeName"] = "node-a"
        with pytest.raises(KubeError) as denied:
            await create_pod(kube, namespace, bypass)
        assert denied.value.status == 403 and "spec.nodeName=node-a" in str(denied.value)
        privileged = pod({"nvidia.com/gpu": "1"})
        privileged["metadata"]["name"] = "privileged"
        privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        with pytest.raises(KubeError) as denied:
            await create_pod(kube, namespace, privileged)
        assert "is privileged" in str(denied.value)


async def test_admission_chain_adds_the_count_a_share_alone_needs(
    controlplane: Any, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """A container naming only gpumem (or percentage, or cores) is stored with
    ``nvidia.com/gpu`` in limits and requests: kubelet calls Allocate only for a container
    whose resources name the plugin's resource, and without Allocate no limit applies."""
    async with webhook_for(controlplane, kube, namespace, tmp_path):
        async with asyncio.timeout(20):
            while True:
                probe = pod({"nvidia.com/gpumem": "1000"})
                probe["metadata"] = {"generateName": "probe-"}
                created = await create_pod(kube, namespace, probe)
                if created["spec"].get("schedulerName") == "hami-scheduler":
                    break
                await asyncio.sleep(0.2)
        shares = (  # canonical quantities (the API server stores 3000 as 3k)
            {"nvidia.com/gpumem": "2500"},
            {"nvidia.com/gpumem-percentage": "50"},
            {"nvidia.com/gpucores": "30"},
        )
        for index, share in enumerate(shares):
            body = pod(share)
            body["metadata"]["name"] = f"share-{index}"
            body["spec"]["initContainers"] = [
                {"name": "i", "resources": {"limits": {"nvidia.com/gpumem": "500"}}}
            ]
            stored = await create_pod(kube, namespace, body)
            resources = stored["spec"]["containers"][0]["resources"]
            assert resources["limits"] == {**share, "nvidia.com/gpu": "1"}
            assert resources["requests"] == resources["limits"]
            init = stored["spec"]["initContainers"][0]["resources"]
            assert init["limits"]["nvidia.com/gpu"] == init["requests"]["nvidia.com/gpu"] == "1"
            assert stored["spec"]["schedulerName"] == "hami-scheduler"
