"""``scheduler.webhook.tls_mode: self``: the role provisions and rotates its serving certificate.

At start every replica reads the Secret ``secret_name``; it creates it when absent (a
create is atomic: the replica that loses the race reads the winner's), reuses it when it is
valid for the Service's names and not due for renewal, and otherwise replaces it with a
``resourceVersion``-guarded update (the loser of a concurrent renewal re-reads). Then it
makes sure hami's entries of the MutatingWebhookConfiguration trust the Secret's CA bundle
and serves the certificate. ``run()`` repeats that every ``check_period``, so a renewal
(at 2/3 of the lifetime, see ``hami.scheduler.certs``), by this replica or another,
reaches every replica's TLS context.

RBAC: see ``hami.scheduler.certs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hami import log
from hami.config import WebhookConfig
from hami.kube.client import Kube
from hami.kube.raw import Conflict, KubeError, NotFound
from hami.scheduler import certs
from hami.scheduler.webhook import ReloadingTLS, WebhookTLSError

_log = log.get(__name__)
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "hami-scheduler"
JSON_PATCH = "application/json-patch+json"
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
UPDATE_TRIES = 3


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def check_period(validity: float) -> float:
    """How often to look at the Secret: often enough to renew well before expiry."""
    return max(1.0, min(60.0, validity / 10))


class SelfTLS:
    def __init__(
        self,
        kube: Kube,
        hook: WebhookConfig,
        namespace: str,
        *,
        now: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.kube = kube
        self.hook = hook
        self.namespace = namespace
        self.now = now
        extra = [h.strip() for h in hook.hosts.split(",") if h.strip()]
        self.hosts = certs.service_hosts(hook.service_name, namespace, extra)
        self.lifetime = dt.timedelta(seconds=hook.validity.seconds)
        self.period = check_period(hook.validity.seconds)
        self.where = f"{namespace}/{hook.secret_name}"
        self.bundle: certs.Bundle | None = None
        self.tls: ReloadingTLS | None = None
        self.rotations = 0  # certificates this replica started serving after the first
        self._dir = Path(tempfile.mkdtemp(prefix="hami-webhook-tls-"))
        self._warned: set[str] = set()

    @property
    def secret_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{self.hook.secret_name}"

    async def start(self) -> ReloadingTLS:
        """Provision (or reuse) the certificate and serve it; WebhookTLSError says why not."""
        try:
            bundle = await self.ensure_secret()
        except (KubeError, certs.CertError) as exc:
            raise WebhookTLSError(
                f"webhook TLS (tls_mode self): cannot provision secret {self.where}: {exc}; "
                "the role needs get/create/update on secrets in its namespace, or set "
                "scheduler.webhook.tls_mode: files (or cert-manager) and mount a certificate"
            ) from exc
        await self.trust(bundle)
        self._write(bundle)
        self.tls = ReloadingTLS(str(self._dir / "tls.crt"), str(self._dir / "tls.key"))
        self.bundle = bundle
        return self.tls

    async def run(self) -> None:
        """Follow the Secret for the life of the role: renew, re-trust, reload."""
        while True:
            await asyncio.sleep(self.period)
            await self.check_once()

    async def check_once(self) -> None:
        try:
            bundle = await self.ensure_secret()
        except (KubeError, certs.CertError) as exc:
            _log.error("webhook certificate check failed", secret=self.where, error=str(exc))
            return
        await self.trust(bundle)
        if self.bundle is not None and bundle.cert_pem == self.bundle.cert_pem:
            return
        self._write(bundle)
        assert self.tls is not None
        if self.tls.maybe_reload(force=True):
            self.bundle = bundle
            self.rotations += 1

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    # ------------------------------------------------------------------ the Secret

    async def ensure_secret(self) -> certs.Bundle:
        """The Secret's bundle, created or renewed when needed."""
        for _ in range(UPDATE_TRIES):
            secret = await self._get_secret()
            now = self.now()
            if secret is None:
                bundle = certs.new_bundle(self.hosts, now, self.lifetime)
                try:
                    await self.kube.create(
                        f"/api/v1/namespaces/{self.namespace}/secrets", self._body(bundle)
                    )
                except Conflict:
                    continue  # another replica created it first: use theirs
                _log.info("webhook certificate created", secret=self.where, hosts=self.hosts)
                return bundle
            self._check_owner(secret)
            previous: certs.Bundle | None = None
            try:
                previous = certs.from_secret_data(secret.get("data"), self.where)
                cert = certs.check(previous, self.hosts, now, self.where)
            except certs.CertError as why:
                reason = str(why)
            else:
                self._note_renewal(cert)
                return previous
            bundle = certs.new_bundle(self.hosts, now, self.lifetime, previous)
            body = self._body(bundle, secret)
            try:
                await self.kube.request("PUT", self.secret_path, body=body)
            except Conflict:
                continue  # another replica renewed it meanwhile: read theirs
            _log.info("webhook certificate renewed", secret=self.where, reason=reason)
            return bundle
        raise certs.CertError(
            f"secret {self.where} changed under every one of {UPDATE_TRIES} updates"
        )

    async def _get_secret(self) -> dict[str, Any] | None:
        try:
            return await self.kube.request("GET", self.secret_path)
        except NotFound:
            return None

    def _check_owner(self, secret: dict[str, Any]) -> None:
        """A TLS Secret of this name without hami's label (made by hand, or by cert-manager
        before tls_mode was self) is adopted: its certificate is replaced unless it is a
        valid bundle of ours. A Secret of another type is someone else's: left alone."""
        labels = (secret.get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY) == MANAGER:
            return
        if secret.get("type") != "kubernetes.io/tls":
            raise certs.CertError(
                f"secret {self.where} exists, is not a kubernetes.io/tls Secret and hami did "
                f"not make it (no label {MANAGED_BY}={MANAGER}); rename it, or set "
                "scheduler.webhook.secret_name to another name"
            )
        self._warn_once(
            "adopt",
            "adopting a TLS secret hami did not make (an earlier certificate made by hand or "
            "by cert-manager); its certificate is replaced unless it is a valid hami bundle",
            secret=self.where,
        )

    def _body(self, bundle: certs.Bundle, current: dict[str, Any] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self.hook.secret_name,
            "namespace": self.namespace,
            "labels": {MANAGED_BY: MANAGER},
        }
        kind = "kubernetes.io/tls"
        if current is not None:
            old = current.get("metadata") or {}
            meta["resourceVersion"] = old.get("resourceVersion")
            meta["labels"] = {**(old.get("labels") or {}), MANAGED_BY: MANAGER}
            kind = str(current.get("type") or kind)  # a Secret's type cannot change
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": kind,
            "data": bundle.secret_data(),
        }

    def _note_renewal(self, cert: Any) -> None:
        key = f"renew:{cert.serial_number}"
        if key not in self._warned:
            self._warned.add(key)
            _log.info(
                "webhook certificate valid",
                secret=self.where,
                expires=cert.not_valid_after_utc.isoformat(),
                renew_after=certs.renew_time(cert).isoformat(),
            )

    # ------------------------------------------------------------------ the caBundle

    async def trust(self, bundle: certs.Bundle) -> None:
        """Make hami's webhook entries trust ``bundle``'s CAs (best effort: a missing
        configuration is logged once and tried again on the next check)."""
        name = self.hook.configuration_name
        path = f"{MWC_PATH}/{name}"
        try:
            configuration = await self.kube.request("GET", path)
        except NotFound:
            self._warn_once(
                "missing",
                "the MutatingWebhookConfiguration does not exist yet; its caBundle is set "
                "once it does",
                configuration=name,
            )
            return
        except KubeError as exc:
            _log.warning(
                "cannot read the webhook configuration", configuration=name, error=str(exc)
            )
            return
        hook = self.hook
        entries = certs.hami_entries(configuration, hook.service_name, self.namespace, self.hosts)
        if not entries:
            self._warn_once(
                "entries",
                "no entry of the webhook configuration calls hami's Service (or a URL on "
                "scheduler.webhook.hosts); nothing to patch",
                configuration=name,
                service=f"{self.namespace}/{hook.service_name}",
            )
            return
        ops = certs.ca_bundle_patch(
            configuration, bundle.ca_bundle_b64, hook.service_name, self.namespace, self.hosts
        )
        if not ops:
            return
        try:
            await self.kube.request("PATCH", path, body=ops, content_type=JSON_PATCH)
        except KubeError as exc:
            # a concurrent change (the guard failed) or no permission: tried again next check
            _log.warning("webhook caBundle patch failed", configuration=name, error=str(exc))
            return
        _log.info("webhook caBundle set", configuration=name, entries=entries)

    def _warn_once(self, key: str, message: str, **fields: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _log.warning(message, **fields)

    # ------------------------------------------------------------------ files

    def _write(self, bundle: certs.Bundle) -> None:
        """ssl loads certificates from files only: a private directory, replaced atomically."""
        for name, data in (("tls.key", bundle.key_pem), ("tls.crt", bundle.cert_pem)):
            final = self._dir / name
            partial = self._dir / f".{name}.partial"
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with contextlib.closing(os.fdopen(fd, "wb")) as out:
                out.write(data)
            os.replace(partial, final)
