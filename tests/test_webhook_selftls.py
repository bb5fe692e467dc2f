"""``scheduler.webhook.tls_mode: self`` on the real API server: the role provisions its
certificate in a Secret, patches the MutatingWebhookConfiguration's caBundle, and the API
server's admission chain then calls the webhook over TLS with that certificate; a second
start reuses the Secret; a short validity rotates the certificate and admission still
works; racing replicas end up with one Secret."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _sched_helpers import unique
from cryptography import x509

from hami import config
from hami.kube.client import Kube
from hami.kube.raw import KubeError
from hami.scheduler.role import SchedulerRole
from hami.scheduler.selftls import SelfTLS
from hami.scheduler.webhook import WebhookTLSError
from hami.testkit.cluster import poll
from hami.testkit.controlplane import ControlPlane, free_port

pytestmark = pytest.mark.controlplane
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
LABEL = "hami.io/selftls-test"


def _config(namespace: str, names: dict[str, str], port: int, validity: str) -> config.Config:
    raw: dict[str, Any] = {
        "scheduler": {
            "http": {"address": "127.0.0.1", "port": 0},
            "extender": {"address": "127.0.0.1", "port": 0},
            "resource_quotas": False,
            "webhook": {
                "enabled": True,
                "address": "127.0.0.1",
                "port": port,
                "tls_mode": "self",
                "namespace": namespace,
                "secret_name": names["secret"],
                "configuration_name": names["configuration"],
                # the API server reaches this webhook by URL on loopback
                "hosts": "127.0.0.1",
                "validity": validity,
            },
        },
        "backends": {"nvidia": {"enabled": True}},
    }
    return config.from_mapping(raw, env={})


def _configuration(name: str, namespace: str, port: int, tag: str) -> dict[str, Any]:
    def entry(hook_name: str, client: dict[str, Any], selector: str) -> dict[str, Any]:
        return {
            "name": hook_name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": client,
            "rules": [
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                }
            ],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "objectSelector": {"matchLabels": {LABEL: selector}},
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            # someone else's entry in the same object: its caBundle must stay as it is
            entry(
                "other.example.com",
                {"service": {"name": "other", "namespace": namespace, "path": "/x"}},
                "never",
            ),
            entry("pods.hami.io", {"url": f"https://127.0.0.1:{port}/webhook"}, tag),
        ],
    }


@pytest.fixture
async def webhook_names(kube: Kube) -> AsyncIterator[dict[str, str]]:
    names = {"secret": unique("hami-tls"), "configuration": unique("hami-webhook")}
    yield names
    with contextlib.suppress(KubeError):
        await kube.delete(f"{MWC}/{names['configuration']}")


async def _secret(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return await kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")


def _b64(secret: dict[str, Any], key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


async def _served(port: int) -> x509.Certificate:
    pem = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
    return x509.load_pem_x509_certificate(pem.encode())


async def _admitted(
    kube: Kube, namespace: str, tag: str, *, dry_run: bool = True
) -> dict[str, Any]:
    """A pod create (dry run unless told) that the API server sends through the webhook."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": unique("p"), "labels": {LABEL: tag}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }
    return await kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        body=pod,
        query=[("dryRun", "All")] if dry_run else [],
    )


async def _wait_admitted(kube: Kube, namespace: str, tag: str) -> dict[str, Any]:
    """The API server picks a changed caBundle up within moments: retry until then."""
    result: dict[str, Any] = {}

    async def mutated() -> bool:
        nonlocal result
        try:
            result = await _admitted(kube, namespace, tag)
        except KubeError:
            return False
        return True

    await poll(mutated, 30, "a pod admitted through the self-provisioned webhook")
    return result


async def test_the_role_provisions_its_certificate_and_admission_uses_it(
    kube: Kube, namespace: str, webhook_names: dict[str, str]
) -> None:
    port, tag = free_port(), unique("t")
    conf_path = f"{MWC}/{webhook_names['configuration']}"
    await kube.create(MWC, _configuration(webhook_names["configuration"], namespace, port, tag))
    # with no caBundle the API server cannot trust the webhook: admission fails closed
    with pytest.raises(KubeError):
        await _admitted(kube, namespace, tag)
    cfg = _config(namespace, webhook_names, port, "8760h")

    async with SchedulerRole(cfg, kube) as role:
        secret = await _secret(kube, namespace, webhook_names["secret"])
        assert secret["type"] == "kubernetes.io/tls"
        assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "hami-scheduler"
        hooks = (await kube.request("GET", conf_path))["webhooks"]
        assert base64.b64decode(hooks[1]["clientConfig"]["caBundle"]) == _b64(secret, "ca.crt")
        assert "caBundle" not in hooks[0]["clientConfig"]  # not ours: untouched
        served = await _served(port)
        assert served == x509.load_pem_x509_certificate(_b64(secret, "tls.crt"))
        names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"hami-scheduler.{namespace}.svc" in names.get_values_for_type(x509.DNSName)

        pod = await _wait_admitted(kube, namespace, tag)
        assert pod["spec"]["schedulerName"] == "hami-scheduler"  # the webhook's mutation
        assert role.webhook_url == f"https://127.0.0.1:{port}/webhook"
        stored = await _admitted(kube, namespace, tag, dry_run=False)  # a real pod too
        assert stored["spec"]["schedulerName"] == "hami-scheduler"

    # a second start (a restart, another replica) reuses the Secret as it is
    async with SchedulerRole(cfg, kube):
        again = await _secret(kube, namespace, webhook_names["secret"])
        assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
        assert await _served(port) == served
        pod = await _wait_admitted(kube, namespace, tag)
        assert pod["spec"]["schedulerName"] == "hami-scheduler"


async def test_a_short_validity_rotates_the_certificate_and_admission_still_works(
    kube: Kube, namespace: str, webhook_names: dict[str, str]
) -> None:
    port, tag = free_port(), unique("t")
    await kube.create(MWC, _configuration(webhook_names["configuration"], namespace, port, tag))
    cfg = _config(namespace, webhook_names, port, "12s")  # renewed ~8 s after it is made
    async with SchedulerRole(cfg, kube) as role:
        first = await _served(port)
        ca = _b64(await _secret(kube, namespace, webhook_names["secret"]), "ca.crt")
        await _wait_admitted(kube, namespace, tag)
        selftls = role.selftls
        assert selftls is not None

        async def rotated() -> bool:
            return selftls.rotations >= 1 and await _served(port) != first

        await poll(rotated, 40, "the serving certificate renewed and reloaded")
        seen: dict[str, Any] = {}

        async def serves_the_secret() -> bool:
            # read twice in a row: a further renewal may fall between two reads
            seen["secret"] = await _secret(kube, namespace, webhook_names["secret"])
            seen["served"] = await _served(port)
            return bool(
                seen["served"] == x509.load_pem_x509_certificate(_b64(seen["secret"], "tls.crt"))
            )

        await poll(serves_the_secret, 20, "the renewed certificate of the Secret served")
        assert seen["served"].serial_number != first.serial_number
        assert _b64(seen["secret"], "ca.crt") == ca  # same CA: the caBundle need not change
        pod = await _wait_admitted(kube, namespace, tag)
        assert pod["spec"]["schedulerName"] == "hami-scheduler"


async def test_racing_replicas_share_one_secret(kube: Kube, namespace: str) -> None:
    names = {"secret": unique("hami-tls"), "configuration": unique("absent")}
    hook = _config(namespace, names, free_port(), "8760h").scheduler.webhook
    replicas = [SelfTLS(kube, hook, namespace) for _ in range(3)]
    try:
        bundles = await asyncio.gather(*(r.ensure_secret() for r in replicas))
    finally:
        for replica in replicas:
            replica.close()
    secret = await _secret(kube, namespace, names["secret"])
    assert {b.cert_pem for b in bundles} == {_b64(secret, "tls.crt")}


async def test_a_secret_of_another_type_is_left_alone(kube: Kube, namespace: str) -> None:
    names = {"secret": unique("theirs"), "configuration": unique("absent")}
    body = {"metadata": {"name": names["secret"]}, "stringData": {"note": "not ours"}}
    await kube.create(f"/api/v1/namespaces/{namespace}/secrets", body)
    cfg = _config(namespace, names, free_port(), "8760h")
    with pytest.raises(WebhookTLSError, match=r"is not a kubernetes\.io/tls Secret"):
        async with SchedulerRole(cfg, kube):
            pass
    secret = await _secret(kube, namespace, names["secret"])
    assert set(secret["data"]) == {"note"}


async def test_a_hand_made_tls_secret_is_adopted(
    kube: Kube, namespace: str, webhook_names: dict[str, str], controlplane: ControlPlane
) -> None:
    # what docker/gen-webhook-certs.sh (or cert-manager) left: tls.crt and tls.key only
    cert, key = controlplane.ca.issue("old", hosts=["127.0.0.1"], server=True)
    body = {
        "metadata": {"name": webhook_names["secret"]},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(cert).decode(),
            "tls.key": base64.b64encode(key).decode(),
        },
    }
    await kube.create(f"/api/v1/namespaces/{namespace}/secrets", body)
    port, tag = free_port(), unique("t")
    await kube.create(MWC, _configuration(webhook_names["configuration"], namespace, port, tag))
    async with SchedulerRole(_config(namespace, webhook_names, port, "8760h"), kube):
        secret = await _secret(kube, namespace, webhook_names["secret"])
        assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "hami-scheduler"
        assert _b64(secret, "tls.crt") != cert
        assert await _served(port) == x509.load_pem_x509_certificate(_b64(secret, "tls.crt"))
        pod = await _wait_admitted(kube, namespace, tag)
        assert pod["spec"]["schedulerName"] == "hami-scheduler"
