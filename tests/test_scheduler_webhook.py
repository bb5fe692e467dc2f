"""The mutating webhook: AdmissionReview v1 answers, and TLS served from files with reload."""

from __future__ import annotations

import asyncio
import base64
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
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hami import config
from hami.scheduler.http import build_app
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
    ops = patch_of(
        review(admission(pod({"nvidia.com/gpu": "2"}, "volcano", init=True)), [NVIDIA], "mine")
    )
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
