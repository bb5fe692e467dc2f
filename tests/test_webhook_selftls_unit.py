"""The webhook's own certificates, pure parts (hami.scheduler.certs): making, checking,
renewing and the caBundle patch. The API server side is in test_webhook_selftls.py."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt

import pytest
from cryptography import x509

from hami.scheduler import certs

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
HOSTS = certs.service_hosts("hami-scheduler", "hami-system", ["127.0.0.1"])


def _sans(pem: bytes) -> set[str]:
    cert = x509.load_pem_x509_certificate(pem)
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in ext.get_values_for_type(x509.DNSName)} | {
        str(v) for v in ext.get_values_for_type(x509.IPAddress)
    }


def test_the_serving_certificate_covers_the_service_names_and_extra_hosts() -> None:
    assert HOSTS[:4] == [
        "hami-scheduler",
        "hami-scheduler.hami-system",
        "hami-scheduler.hami-system.svc",
        "hami-scheduler.hami-system.svc.cluster.local",
    ]
    bundle = certs.new_bundle(HOSTS, NOW, 30 * DAY)
    assert _sans(bundle.cert_pem) == set(HOSTS)
    cert = certs.check(bundle, HOSTS, NOW, "ns/s")
    assert cert.not_valid_after_utc == NOW + 30 * DAY
    ca = x509.load_pem_x509_certificate(bundle.ca_pem)
    assert ca.not_valid_after_utc == NOW + 300 * DAY  # the CA lives 10x longer


def test_renewal_is_due_at_two_thirds_of_the_lifetime() -> None:
    bundle = certs.new_bundle(HOSTS, NOW, 30 * DAY)
    cert = certs.check(bundle, HOSTS, NOW + 15 * DAY, "ns/s")
    due = certs.renew_time(cert)
    assert NOW + 15 * DAY < due < NOW + 21 * DAY
    with pytest.raises(certs.CertError, match="due for renewal"):
        certs.check(bundle, HOSTS, due, "ns/s")


def test_check_refuses_what_cannot_be_served() -> None:
    bundle = certs.new_bundle(HOSTS, NOW, 30 * DAY)
    other = certs.new_bundle(HOSTS, NOW, 30 * DAY)
    with pytest.raises(certs.CertError, match=r"does not cover other\.example"):
        certs.check(bundle, [*HOSTS, "other.example"], NOW, "ns/s")
    with pytest.raises(certs.CertError, match=r"tls\.key does not match"):
        certs.check(dataclasses.replace(bundle, key_pem=other.key_pem), HOSTS, NOW, "ns/s")
    with pytest.raises(certs.CertError, match="not signed by a CA"):
        certs.check(dataclasses.replace(bundle, ca_pem=other.ca_pem), HOSTS, NOW, "ns/s")
    with pytest.raises(certs.CertError, match="ns/s: does not parse"):
        certs.check(dataclasses.replace(bundle, cert_pem=b"junk"), HOSTS, NOW, "ns/s")


def test_secret_data_round_trips_and_bad_data_names_the_key() -> None:
    bundle = certs.new_bundle(HOSTS, NOW, 30 * DAY)
    assert certs.from_secret_data(bundle.secret_data(), "ns/s") == bundle
    data = bundle.secret_data()
    del data["ca.key"]
    with pytest.raises(certs.CertError, match=r"secret ns/s lacks ca\.key"):
        certs.from_secret_data(data, "ns/s")
    with pytest.raises(certs.CertError, match=r"tls\.crt is not base64"):
        certs.from_secret_data({**bundle.secret_data(), "tls.crt": "%%%"}, "ns/s")
    with pytest.raises(certs.CertError, match="has no data"):
        certs.from_secret_data(None, "ns/s")


def test_renewal_keeps_the_ca_while_it_is_good_then_trusts_old_and_new() -> None:
    first = certs.new_bundle(HOSTS, NOW, 30 * DAY)
    second = certs.new_bundle(HOSTS, NOW + 20 * DAY, 30 * DAY, first)
    assert second.ca_pem == first.ca_pem  # the caBundle does not change
    assert second.cert_pem != first.cert_pem
    certs.check(second, HOSTS, NOW + 20 * DAY, "ns/s")
    # past 2/3 of the CA's 300 days: a new CA signs, the old one stays trusted
    late = NOW + 201 * DAY
    third = certs.new_bundle(HOSTS, late, 30 * DAY, second)
    cas = x509.load_pem_x509_certificates(third.ca_pem)
    assert len(cas) == 2
    assert cas[1] == x509.load_pem_x509_certificate(first.ca_pem)
    certs.check(third, HOSTS, late, "ns/s")
    # a certificate of the old CA still verifies against the new bundle
    certs.check(dataclasses.replace(second, ca_pem=third.ca_pem), HOSTS, NOW + 20 * DAY, "ns/s")


def _configuration(ca: str | None = None) -> dict[str, object]:
    ours = {
        "name": "pods.hami.io",
        "clientConfig": {
            "service": {"name": "hami-scheduler", "namespace": "hami-system", "path": "/webhook"}
        },
    }
    if ca is not None:
        ours["clientConfig"]["caBundle"] = ca  # type: ignore[index]
    return {
        "webhooks": [
            {
                "name": "other.example.com",
                "clientConfig": {"service": {"name": "other", "namespace": "hami-system"}},
            },
            ours,
            {"name": "local.hami.io", "clientConfig": {"url": "https://127.0.0.1:9443/webhook"}},
            {"name": "far.example.com", "clientConfig": {"url": "https://10.0.0.1/webhook"}},
        ]
    }


def test_the_ca_bundle_patch_touches_only_hamis_entries() -> None:
    value = base64.b64encode(b"pem").decode()
    conf = _configuration()
    ops = certs.ca_bundle_patch(conf, value, "hami-scheduler", "hami-system", HOSTS)
    assert ops == [
        {"op": "test", "path": "/webhooks/1/name", "value": "pods.hami.io"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": value},
        {"op": "test", "path": "/webhooks/2/name", "value": "local.hami.io"},
        {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": value},
    ]
    assert certs.hami_entries(conf, "hami-scheduler", "hami-system", HOSTS) == [
        "pods.hami.io",
        "local.hami.io",
    ]
    # already trusted: nothing to do for that entry
    done = certs.ca_bundle_patch(_configuration(value), value, "hami-scheduler", "hami-system", [])
    assert done == []
    assert certs.ca_bundle_patch({"webhooks": "junk"}, value, "s", "n", HOSTS) == []
