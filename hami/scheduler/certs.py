"""The webhook's own certificates (``scheduler.webhook.tls_mode: self``): pure parts.

Making a CA and a serving certificate, reading them back from a Secret's data, deciding
whether they are still good, and the JSON patch that puts the CA into the
MutatingWebhookConfiguration. No I/O here; ``hami.scheduler.selftls`` talks to the API
server and reloads the TLS context.

RBAC the scheduler role needs for the self mode (the Helm chart renders it):

- ``secrets``: get, create, update, in its own namespace (the Secret ``secret_name``);
- ``mutatingwebhookconfigurations`` (admissionregistration.k8s.io): get, patch
  (the object ``configuration_name``; the patch only sets ``caBundle``).

The Secret (type ``kubernetes.io/tls``) holds ``tls.crt``/``tls.key`` (the serving pair),
``ca.crt`` (the CA bundle the API server must trust: the current CA, plus the previous one
while it is still valid, so replicas that still serve a certificate of the old CA keep
working during a CA rotation) and ``ca.key`` (to sign the next serving certificate).

Lifetimes: the serving certificate is renewed at 2/3 of its lifetime (``RENEW_AT``), the
CA lives ``CA_LIFETIME_FACTOR`` times longer and is renewed the same way.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

RENEW_AT = 2 / 3  # of a certificate's lifetime
CA_LIFETIME_FACTOR = 10
MAX_BACKDATE = dt.timedelta(minutes=5)  # tolerance for API servers whose clock is behind

CERT_KEY = "tls.crt"
KEY_KEY = "tls.key"
CA_KEY = "ca.crt"
CA_PRIVATE_KEY = "ca.key"


class CertError(ValueError):
    """A Secret's certificates cannot be used; the message says which part and why."""


@dataclass(frozen=True)
class Bundle:
    """A CA and a serving certificate it signed, as PEM."""

    ca_pem: bytes  # the CA bundle to trust: current CA first, maybe the previous one
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def secret_data(self) -> dict[str, str]:
        """The Secret's ``data`` (base64 values)."""
        raw = {
            CERT_KEY: self.cert_pem,
            KEY_KEY: self.key_pem,
            CA_KEY: self.ca_pem,
            CA_PRIVATE_KEY: self.ca_key_pem,
        }
        return {k: base64.b64encode(v).decode() for k, v in raw.items()}

    @property
    def ca_bundle_b64(self) -> str:
        """The value of a webhook's ``clientConfig.caBundle``."""
        return base64.b64encode(self.ca_pem).decode()


def service_hosts(service: str, namespace: str, extra: Sequence[str] = ()) -> list[str]:
    """The names the serving certificate must cover: the Service's DNS names (what the API
    server dials for a ``clientConfig.service``) plus ``extra`` (DNS names or IPs)."""
    hosts = [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]
    return hosts + [h for h in extra if h and h not in hosts]


def _backdate(lifetime: dt.timedelta) -> dt.timedelta:
    return min(MAX_BACKDATE, lifetime / 10)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_usage(*, sign_certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign_certs,
        crl_sign=sign_certs,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(
    now: dt.datetime, lifetime: dt.timedelta, common_name: str = "hami-webhook-ca"
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"{common_name}@{int(now.timestamp())}")  # a new CA per rotation
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _backdate(lifetime))
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(sign_certs=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_serving(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    hosts: Sequence[str],
    now: dt.datetime,
    lifetime: dt.timedelta,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    # never outlive the CA: a chain with an expired CA is refused
    not_after = min(now + lifetime, ca.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0] if hosts else "hami-webhook"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _backdate(lifetime))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(sign_certs=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def new_bundle(
    hosts: Sequence[str],
    now: dt.datetime,
    lifetime: dt.timedelta,
    previous: Bundle | None = None,
) -> Bundle:
    """A serving certificate for ``hosts``; signed by ``previous``'s CA while that CA is
    good for a whole serving lifetime, else by a new CA (the old one stays in the bundle
    until it expires)."""
    ca_lifetime = lifetime * CA_LIFETIME_FACTOR
    reused = _reusable_ca(previous, now, lifetime)
    if reused is not None:
        ca, ca_key = reused
        trusted = previous.ca_pem if previous is not None else _cert_pem(ca)
    else:
        ca, ca_key = make_ca(now, ca_lifetime)
        trusted = _cert_pem(ca) + _still_valid_cas(previous, now)
    cert, key = make_serving(ca, ca_key, hosts, now, lifetime)
    return Bundle(
        ca_pem=trusted, ca_key_pem=_key_pem(ca_key), cert_pem=_cert_pem(cert), key_pem=_key_pem(key)
    )


def _reusable_ca(
    previous: Bundle | None, now: dt.datetime, lifetime: dt.timedelta
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    if previous is None:
        return None
    try:
        ca = x509.load_pem_x509_certificate(previous.ca_pem)
        ca_key = serialization.load_pem_private_key(previous.ca_key_pem, None)
    except ValueError:
        return None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        return None
    if ca.public_key() != ca_key.public_key():
        return None
    if renewal_due(ca, now) or ca.not_valid_after_utc < now + lifetime:
        return None
    return ca, ca_key


def _still_valid_cas(previous: Bundle | None, now: dt.datetime) -> bytes:
    if previous is None:
        return b""
    try:
        cas = x509.load_pem_x509_certificates(previous.ca_pem)
    except ValueError:
        return b""
    # only the newest previous CA: an older one signed nothing still served
    for ca in cas[:1]:
        if ca.not_valid_after_utc > now:
            return _cert_pem(ca)
    return b""


def renewal_due(cert: x509.Certificate, now: dt.datetime, at: float = RENEW_AT) -> bool:
    """Whether ``at`` of the certificate's lifetime has passed (or it is not valid yet)."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now < start:
        return True
    return now >= start + (end - start) * at


def renew_time(cert: x509.Certificate, at: float = RENEW_AT) -> dt.datetime:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start + (end - start) * at


def from_secret_data(data: Mapping[str, Any] | None, where: str) -> Bundle:
    """A Secret's ``data`` -> Bundle; CertError names the Secret and the broken key."""
    if not isinstance(data, Mapping):
        raise CertError(f"secret {where} has no data")
    values: dict[str, bytes] = {}
    for key in (CERT_KEY, KEY_KEY, CA_KEY, CA_PRIVATE_KEY):
        raw = data.get(key)
        if not isinstance(raw, str) or not raw:
            raise CertError(f"secret {where} lacks {key}")
        try:
            values[key] = base64.b64decode(raw, validate=True)
        except ValueError:
            raise CertError(f"secret {where}: {key} is not base64") from None
    return Bundle(
        ca_pem=values[CA_KEY],
        ca_key_pem=values[CA_PRIVATE_KEY],
        cert_pem=values[CERT_KEY],
        key_pem=values[KEY_KEY],
    )


def check(bundle: Bundle, hosts: Sequence[str], now: dt.datetime, where: str) -> x509.Certificate:
    """The serving certificate if the bundle can be served now and is not due for renewal:
    it parses, its key matches, a CA of the bundle signed it, it covers ``hosts``."""
    try:
        cert = x509.load_pem_x509_certificate(bundle.cert_pem)
        key = serialization.load_pem_private_key(bundle.key_pem, None)
        cas = x509.load_pem_x509_certificates(bundle.ca_pem)
    except ValueError as exc:
        raise CertError(f"secret {where}: does not parse: {exc}") from None
    if cert.public_key() != key.public_key():
        raise CertError(f"secret {where}: tls.key does not match tls.crt")
    if not any(_signed_by(cert, ca) for ca in cas):
        raise CertError(f"secret {where}: tls.crt is not signed by a CA in ca.crt")
    covered = set(_sans(cert))
    missing = [h for h in hosts if _normal(h) not in covered]
    if missing:
        raise CertError(f"secret {where}: tls.crt does not cover {', '.join(missing)}")
    if renewal_due(cert, now):
        raise CertError(f"secret {where}: tls.crt is due for renewal (expires {_when(cert)})")
    return cert


def _when(cert: x509.Certificate) -> str:
    return cert.not_valid_after_utc.isoformat()


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _normal(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


def _sans(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    names = [str(n).lower() for n in ext.get_values_for_type(x509.DNSName)]
    return names + [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)]


def ca_bundle_patch(
    configuration: Mapping[str, Any],
    ca_bundle_b64: str,
    service: str,
    namespace: str,
    hosts: Sequence[str],
) -> list[dict[str, Any]]:
    """JSON patch setting ``caBundle`` on hami's entries of a MutatingWebhookConfiguration:
    those whose ``clientConfig.service`` is hami's Service, or whose ``clientConfig.url``
    names one of ``hosts`` (a webhook reached by URL). Each replace is guarded by a test of
    the entry's name, so a concurrent reorder fails the patch instead of hitting another
    entry. Empty when every such entry already has the bundle."""
    ops: list[dict[str, Any]] = []
    webhooks = configuration.get("webhooks")
    if not isinstance(webhooks, list):
        return ops
    wanted = {_normal(h) for h in hosts}
    for index, hook in enumerate(webhooks):
        if not isinstance(hook, Mapping) or not _is_ours(hook, service, namespace, wanted):
            continue
        client = hook.get("clientConfig") or {}
        if client.get("caBundle") == ca_bundle_b64:
            continue
        ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": hook.get("name")})
        ops.append(
            {
                "op": "add",
                "path": f"/webhooks/{index}/clientConfig/caBundle",
                "value": ca_bundle_b64,
            }
        )
    return ops


def hami_entries(
    configuration: Mapping[str, Any], service: str, namespace: str, hosts: Sequence[str]
) -> list[str]:
    """The names of the entries ``ca_bundle_patch`` looks after."""
    webhooks = configuration.get("webhooks")
    if not isinstance(webhooks, list):
        return []
    wanted = {_normal(h) for h in hosts}
    return [
        str(hook.get("name"))
        for hook in webhooks
        if isinstance(hook, Mapping) and _is_ours(hook, service, namespace, wanted)
    ]


def _is_ours(hook: Mapping[str, Any], service: str, namespace: str, hosts: set[str]) -> bool:
    client = hook.get("clientConfig")
    if not isinstance(client, Mapping):
        return False
    svc = client.get("service")
    if isinstance(svc, Mapping):
        return svc.get("name") == service and svc.get("namespace") == namespace
    url = client.get("url")
    if not isinstance(url, str):
        return False
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    return _normal(host) in hosts
