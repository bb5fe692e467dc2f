"""Where the API server is and how to authenticate: kubeconfig files and in-cluster config.

The project's own loader, so that the node agent never imports ``kubernetes_asyncio``: its
config package imports ``kubernetes_asyncio.client`` (844 modules of generated API classes
and models, about 36 MiB resident) although only the loader is used (docs/performance.md,
"Node agent"). It reads what kubernetes_asyncio's loader read for this project:

- kubeconfig: one file or a ``:``-separated list (merged as kubectl merges them: the first
  file that names a cluster, user, context or current-context wins), its current context;
  cluster ``server``, ``certificate-authority`` / ``-data``, ``insecure-skip-tls-verify``,
  ``tls-server-name``, ``proxy-url``; user ``client-certificate`` / ``-data``,
  ``client-key`` / ``-data``, ``token``, ``tokenFile`` (re-read every minute), ``username``
  + ``password`` (Basic), ``exec`` credential plugins (a token, re-run when it expires, or
  a client certificate). A relative path is relative to the file that names it. A user
  with an ``auth-provider`` (legacy gcp / oidc) is handed to kubernetes_asyncio's loader,
  the one case that still imports its client package.
- in-cluster: ``KUBERNETES_SERVICE_HOST`` / ``_PORT``, the service account's CA and token
  (re-read every minute: kubelet rotates projected tokens).

Every error is a ``KubeConfigError`` that names the file (or variable) and the fix.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# client-go and kubernetes_asyncio re-read a token file once a minute.
TOKEN_REFRESH_PERIOD = 60.0
# An exec plugin's token is renewed this long before its expirationTimestamp.
EXEC_EXPIRY_SKEW = 30.0


class KubeConfigError(RuntimeError):
    """No way to reach the API server was found; the message says which were tried."""


class Credentials(Protocol):
    async def authorization(self) -> str | None:
        """The ``Authorization`` header for the next request (None: none)."""
        ...


@dataclass(frozen=True, slots=True)
class StaticToken:
    header: str

    async def authorization(self) -> str | None:
        return self.header


@dataclass(slots=True)
class TokenFile:
    """A bearer token read from ``path``, re-read when older than ``period`` seconds (a
    rotated token is picked up without a restart). A file that became unreadable keeps the
    last token: the API server then says whether it still holds."""

    path: str
    period: float = TOKEN_REFRESH_PERIOD
    clock: Callable[[], float] = time.monotonic
    _token: str = ""
    _read_at: float | None = None

    def read(self) -> str:
        try:
            token = Path(self.path).read_text().strip()
        except OSError as exc:
            raise KubeConfigError(f"token file {self.path}: {exc.strerror or exc}") from exc
        if not token:
            raise KubeConfigError(f"token file {self.path} is empty")
        self._token, self._read_at = token, self.clock()
        return token

    async def authorization(self) -> str | None:
        if self._read_at is None or self.clock() - self._read_at >= self.period:
            try:
                self.read()
            except KubeConfigError:
                if not self._token:
                    raise
                self._read_at = self.clock()  # try again next period, not every request
        return f"Bearer {self._token}"


@dataclass(slots=True)
class ExecCredentials:
    """A client-go credential plugin (``users[].user.exec``): runs it for a token, again
    when the token's ``expirationTimestamp`` is near (a token without one is kept)."""

    command: str
    args: list[str]
    env: dict[str, str]
    api_version: str
    where: str  # "kubeconfig <file>: user <name>", for errors
    clock: Callable[[], float] = time.time
    _header: str | None = None
    _expires: float | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def run(self) -> dict[str, Any]:
        """The plugin's ``status`` (token, or clientCertificateData + clientKeyData)."""
        info = {"apiVersion": self.api_version, "kind": "ExecCredential"}
        env = {**os.environ, **self.env}
        env["KUBERNETES_EXEC_INFO"] = json.dumps({**info, "spec": {"interactive": False}})
        fix = "fix users[].user.exec in the kubeconfig, or run the command by hand to see why"
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command,
                *self.args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise KubeConfigError(
                f"{self.where}: exec plugin {self.command!r} did not start: "
                f"{exc.strerror or exc}; {fix}"
            ) from exc
        out, err = await proc.communicate()
        if proc.returncode != 0:
            detail = err.decode(errors="replace").strip()[-500:]
            raise KubeConfigError(
                f"{self.where}: exec plugin {self.command!r} exited {proc.returncode}"
                f"{': ' + detail if detail else ''}; {fix}"
            )
        try:
            answer = json.loads(out)
            status = answer["status"]
            if answer.get("apiVersion") != self.api_version or not isinstance(status, dict):
                raise ValueError(f"apiVersion {answer.get('apiVersion')!r}, not {info}")
        except (ValueError, KeyError, TypeError) as exc:
            raise KubeConfigError(
                f"{self.where}: exec plugin {self.command!r} printed no ExecCredential "
                f"of {self.api_version} ({exc}); {fix}"
            ) from exc
        return status

    def take(self, status: Mapping[str, Any]) -> None:
        token = status.get("token")
        self._header = f"Bearer {token}" if token else None
        self._expires = _rfc3339(status.get("expirationTimestamp"))

    async def authorization(self) -> str | None:
        async with self._lock:  # one plugin run at a time; the others reuse its token
            stale = self._expires is not None and self.clock() >= self._expires - EXEC_EXPIRY_SKEW
            if stale:
                self.take(await self.run())
        return self._header


def _rfc3339(value: Any) -> float | None:
    if not value:
        return None
    try:
        when = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


@dataclass(slots=True)
class ClusterConfig:
    """One API server and how to reach it (attribute names as kubernetes_asyncio's
    ``Configuration`` has them). ``*_data`` hold PEM bytes where the kubeconfig had data
    instead of a file; ``source`` names where it came from, for errors."""

    host: str
    ssl_ca_cert: str | None = None
    ca_data: bytes | None = None
    cert_file: str | None = None
    cert_data: bytes | None = None
    key_file: str | None = None
    key_data: bytes | None = None
    verify_ssl: bool = True
    tls_server_name: str | None = None
    proxy: str | None = None
    credentials: Credentials | None = None
    source: str = ""

    async def authorization(self) -> str | None:
        return await self.credentials.authorization() if self.credentials else None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS settings of an https server (None for http)."""
        if not self.host.startswith("https"):
            return None
        try:
            context = ssl.create_default_context(
                cafile=self.ssl_ca_cert,
                cadata=self.ca_data.decode() if self.ca_data else None,
            )
            if not self.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if self.cert_file or self.cert_data:
                _load_cert_chain(context, self)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise KubeConfigError(
                f"{self.source}: the CA or client certificate does not load ({exc}); "
                "check certificate-authority, client-certificate and client-key"
            ) from exc
        return context


def _load_cert_chain(context: ssl.SSLContext, cfg: ClusterConfig) -> None:
    """``ssl`` reads a client certificate only from files: data goes through a private
    directory that is removed straight after."""
    with tempfile.TemporaryDirectory(prefix="hami-kube-") as scratch:
        cert, key = cfg.cert_file, cfg.key_file
        if cfg.cert_data:
            cert = os.path.join(scratch, "tls.crt")
            Path(cert).write_bytes(cfg.cert_data)
        if cfg.key_data:
            key = os.path.join(scratch, "tls.key")
            Path(key).write_bytes(cfg.key_data)
        assert cert is not None
        context.load_cert_chain(cert, key)


# --------------------------------------------------------------------------- in-cluster


def load_incluster(
    environ: Mapping[str, str] = os.environ,
    directory: str = SERVICE_ACCOUNT_DIR,
    clock: Callable[[], float] = time.monotonic,
) -> ClusterConfig:
    """The service account's view of its own cluster (what a pod is given)."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError(
            "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both "
            f"be set (got {host!r}, {port!r}); run in a pod, or pass --kubeconfig"
        )
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    token = TokenFile(os.path.join(directory, "token"), clock=clock)
    ca = os.path.join(directory, "ca.crt")
    fix = "mount the service account token (automountServiceAccountToken) or pass --kubeconfig"
    try:
        token.read()
        ca_pem = Path(ca).read_bytes().strip()
    except KubeConfigError as exc:
        raise KubeConfigError(f"in-cluster config: {exc}; {fix}") from exc
    except OSError as exc:
        raise KubeConfigError(f"in-cluster config: CA file {ca}: {exc.strerror}; {fix}") from exc
    if not ca_pem:
        raise KubeConfigError(f"in-cluster config: CA file {ca} is empty; {fix}")
    return ClusterConfig(host=server, ssl_ca_cert=ca, credentials=token, source="in-cluster")


# --------------------------------------------------------------------------- kubeconfig


@dataclass(frozen=True, slots=True)
class _Entry:
    body: dict[str, Any]
    file: str  # the file that named it: relative paths are relative to its directory


def _read_files(paths: str) -> tuple[list[str], dict[str, dict[str, _Entry]], str | None]:
    """The files read, their clusters/users/contexts by name (first file wins, as with
    kubectl), and the first current-context."""
    files: list[str] = []
    named: dict[str, dict[str, _Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
    current: str | None = None
    for raw in paths.split(os.pathsep):
        if not raw:
            continue
        path = os.path.expanduser(raw)
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            continue  # kubectl skips missing files of a list
        except OSError as exc:
            raise KubeConfigError(
                f"kubeconfig {path}: cannot read it ({exc.strerror}); fix its permissions "
                "or pass another with --kubeconfig"
            ) from exc
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise KubeConfigError(
                f"kubeconfig {path}: not YAML ({exc}); fix the file or pass another"
            ) from exc
        if not isinstance(data, dict):
            raise KubeConfigError(f"kubeconfig {path}: not a kubeconfig (a mapping expected)")
        files.append(path)
        for kind, by_name in named.items():
            items = data.get(kind) or []
            if not isinstance(items, list):
                raise KubeConfigError(f"kubeconfig {path}: {kind} must be a list")
            key = kind[:-1]  # clusters[].cluster, users[].user, contexts[].context
            for item in items:
                if not isinstance(item, dict) or not item.get("name"):
                    raise KubeConfigError(f"kubeconfig {path}: an entry of {kind} has no name")
                body = item.get(key) or {}
                if not isinstance(body, dict):
                    raise KubeConfigError(
                        f"kubeconfig {path}: {kind} {item['name']!r}: {key} must be a mapping"
                    )
                by_name.setdefault(str(item["name"]), _Entry(body, path))
        if current is None and data.get("current-context"):
            current = str(data["current-context"])
    return files, named, current


async def load_kubeconfig(paths: str, context: str | None = None) -> ClusterConfig:
    """The cluster and user of ``context`` (default: the current context) of the kubeconfig
    file(s) ``paths``."""
    files, named, current = _read_files(paths)
    where = f"kubeconfig {paths}"
    if not files:
        raise KubeConfigError(f"{where}: no such file; pass --kubeconfig or set KUBECONFIG")
    name = context or current
    if not name:
        raise KubeConfigError(
            f"{where}: no current-context; set one (kubectl config use-context NAME)"
        )
    ctx = named["contexts"].get(name)
    if ctx is None:
        known = ", ".join(sorted(named["contexts"])) or "none"
        raise KubeConfigError(
            f"{where}: context {name!r} is not in contexts (known: {known}); "
            "kubectl config use-context NAME"
        )
    cluster_name = str(ctx.body.get("cluster") or "")
    cluster = named["clusters"].get(cluster_name)
    if cluster is None:
        raise KubeConfigError(
            f"kubeconfig {ctx.file}: context {name!r} names cluster {cluster_name!r}, which "
            "is not in clusters; add it or fix the context"
        )
    user_name = str(ctx.body.get("user") or "")
    user = named["users"].get(user_name) if user_name else None  # no user: anonymous
    if user is not None and isinstance(user.body.get("auth-provider"), dict):
        return await _via_kubernetes_asyncio(paths, name)
    server = str(cluster.body.get("server") or "").rstrip("/")
    if not server:
        raise KubeConfigError(
            f"kubeconfig {cluster.file}: cluster {cluster_name!r} has no server; add "
            "clusters[].cluster.server (https://HOST:PORT)"
        )
    cfg = ClusterConfig(host=server, source=f"kubeconfig {cluster.file}")
    c = cluster.body
    if server.startswith("https"):
        cfg.ssl_ca_cert, cfg.ca_data = _file_or_data(
            c, "certificate-authority", cluster.file, f"cluster {cluster_name!r}"
        )
    if "insecure-skip-tls-verify" in c:
        cfg.verify_ssl = not c["insecure-skip-tls-verify"]
    cfg.tls_server_name = c.get("tls-server-name") or None
    cfg.proxy = c.get("proxy-url") or None
    if user is not None:
        await _authenticate(cfg, user, user_name)
    return cfg


def _file_or_data(
    body: Mapping[str, Any], key: str, file: str, what: str
) -> tuple[str | None, bytes | None]:
    """``key``-data (base64, preferred) or ``key`` (a path, relative to ``file``)."""
    data = body.get(f"{key}-data")
    if data:
        try:
            return None, base64.b64decode(str(data), validate=True)
        except ValueError as exc:
            raise KubeConfigError(
                f"kubeconfig {file}: {what}: {key}-data is not base64 ({exc}); "
                "encode the PEM with base64 -w0"
            ) from exc
    path = body.get(key)
    if not path:
        return None, None
    full = _relative(file, path)
    if not os.path.isfile(full):
        raise KubeConfigError(
            f"kubeconfig {file}: {what}: {key} {full} does not exist; fix the path "
            "(a relative one is relative to the kubeconfig's directory)"
        )
    return full, None


def _relative(file: str, path: Any) -> str:
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(file)), str(path)))


async def _authenticate(cfg: ClusterConfig, user: _Entry, name: str) -> None:
    """The user's credentials, in kubernetes_asyncio's order: exec, token, Basic; a client
    certificate may come along with any of them."""
    u, what = user.body, f"user {name!r}"
    https = cfg.host.startswith("https")
    if https:
        cfg.cert_file, cfg.cert_data = _file_or_data(u, "client-certificate", user.file, what)
        cfg.key_file, cfg.key_data = _file_or_data(u, "client-key", user.file, what)
    if isinstance(u.get("exec"), dict):
        plugin = _exec(u["exec"], f"kubeconfig {user.file}: {what}")
        status = await plugin.run()
        plugin.take(status)
        if status.get("token"):
            cfg.credentials = plugin
            return
        if status.get("clientCertificateData") and status.get("clientKeyData"):
            cfg.cert_file = cfg.key_file = None
            cfg.cert_data = str(status["clientCertificateData"]).encode()
            cfg.key_data = str(status["clientKeyData"]).encode()
            return
        raise KubeConfigError(
            f"kubeconfig {user.file}: {what}: the exec plugin gave neither a token nor "
            "clientCertificateData + clientKeyData; fix the plugin or its arguments"
        )
    if u.get("token"):
        cfg.credentials = StaticToken(f"Bearer {u['token']}")
    elif u.get("tokenFile"):
        token = TokenFile(_relative(user.file, u["tokenFile"]))
        try:
            token.read()
        except KubeConfigError as exc:
            raise KubeConfigError(
                f"kubeconfig {user.file}: {what}: {exc}; fix tokenFile (a relative path is "
                "relative to the kubeconfig's directory)"
            ) from exc
        cfg.credentials = token
    elif "username" in u and "password" in u:
        basic = base64.b64encode(f"{u['username']}:{u['password']}".encode()).decode()
        cfg.credentials = StaticToken(f"Basic {basic}")


def _exec(spec: Mapping[str, Any], where: str) -> ExecCredentials:
    if not spec.get("command") or not spec.get("apiVersion"):
        raise KubeConfigError(
            f"{where}: exec needs command and apiVersion "
            "(e.g. client.authentication.k8s.io/v1); add them"
        )
    args = spec.get("args") or []
    env = spec.get("env") or []
    if not isinstance(args, list) or not isinstance(env, list):
        raise KubeConfigError(f"{where}: exec args and env must be lists")
    return ExecCredentials(
        command=str(spec["command"]),
        args=[str(a) for a in args],
        env={str(e["name"]): str(e["value"]) for e in env if isinstance(e, dict)},
        api_version=str(spec["apiVersion"]),
        where=where,
    )


async def _via_kubernetes_asyncio(paths: str, context: str) -> ClusterConfig:
    """A user with an auth-provider (gcp, oidc: deprecated in kubectl since 1.26): loaded
    as before, by kubernetes_asyncio (this imports its client package)."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        await config.load_kube_config(
            config_file=paths, context=context, client_configuration=configuration
        )
    except config.ConfigException as exc:
        raise KubeConfigError(f"kubeconfig {paths}: {exc}") from exc
    key = await configuration.get_api_key_with_prefix("BearerToken")
    return ClusterConfig(
        host=str(configuration.host),
        ssl_ca_cert=configuration.ssl_ca_cert,
        cert_file=configuration.cert_file,
        key_file=configuration.key_file,
        verify_ssl=configuration.verify_ssl,
        tls_server_name=configuration.tls_server_name,
        proxy=configuration.proxy,
        credentials=StaticToken(key) if key else None,
        source=f"kubeconfig {paths}",
    )


# --------------------------------------------------------------------------- choice


def default_kubeconfig() -> str:
    """``KUBECONFIG`` (one path or a list), else ~/.kube/config."""
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def _any_exists(paths: str) -> bool:
    return any(os.path.exists(os.path.expanduser(p)) for p in paths.split(os.pathsep) if p)


async def load_cluster_config(kubeconfig: str | None = None) -> ClusterConfig:
    """``kubeconfig`` if given; else in-cluster when ``KUBERNETES_SERVICE_HOST`` is set;
    else ``KUBECONFIG`` / ~/.kube/config."""
    if kubeconfig:
        return await load_kubeconfig(kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return load_incluster()
    paths = default_kubeconfig()
    if not _any_exists(paths):
        raise KubeConfigError(
            "no API server configured: not in a cluster (KUBERNETES_SERVICE_HOST unset) and no "
            f"kubeconfig at {paths}; pass --kubeconfig or set KUBECONFIG"
        )
    return await load_kubeconfig(paths)
