"""etcd, kube-apiserver and kube-scheduler as local processes (the envtest approach).

    cp = ControlPlane()          # finds the binaries, makes a temp dir under /tmp
    cp.start()                   # etcd + kube-apiserver, waits for /readyz, writes a kubeconfig
    sched = cp.start_scheduler({"profiles": [{"schedulerName": "default-scheduler"}]})
    cm = cp.start_controller_manager()   # optional: only the DRA resourceclaim controller
    ...
    cp.stop()                    # stops the scheduler(s), kube-apiserver and etcd

Dynamic Resource Allocation needs nothing extra on 1.36: resource.k8s.io/v1 is served by
default and DynamicResourceAllocation and DRAAdminAccess (GA, locked on: setting either
false is refused), DRAConsumableCapacity, DRAPartitionableDevices and DRAExtendedResource
(beta) are on by default in kube-apiserver, kube-scheduler and kube-controller-manager.
What DRA does need is kube-controller-manager's resourceclaim controller
(ResourceClaimTemplate -> ResourceClaim, claims of finished pods deallocated); it is off
by default here so the other tests start as fast as before.

Everything here is synchronous (subprocess.Popen and blocking HTTP polls) so it can run in
a pytest session fixture; from asyncio code call it through `asyncio.to_thread`. Children
are started in their own process group with a parent-death signal, and an `atexit` hook
stops whatever is still running, so a crashed test run leaves no etcd or apiserver behind.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import datetime as dt
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Kubernetes version that tests/controlplane/build.sh builds (its go.mod pins it).
KUBERNETES_VERSION = "v1.36.2"

ENV_DIR = "HAMI_CONTROLPLANE_DIR"
ENV_ETCD = "HAMI_ETCD"
ENV_APISERVER = "HAMI_KUBE_APISERVER"
ENV_SCHEDULER = "HAMI_KUBE_SCHEDULER"
ENV_CONTROLLER_MANAGER = "HAMI_KUBE_CONTROLLER_MANAGER"

#: kube-controller-manager's name for the DRA claim controller (cmd/kube-controller-manager/names)
RESOURCE_CLAIM_CONTROLLER = "resourceclaim-controller"

FIX_HINT = (
    "run `make controlplane` (tests/controlplane/build.sh) to build them into the cache, "
    f"or point {ENV_DIR} at a directory holding etcd, kube-apiserver and kube-scheduler, "
    f"or set {ENV_ETCD}, {ENV_APISERVER} and {ENV_SCHEDULER} to the binaries"
)


class ControlPlaneError(RuntimeError):
    """A control plane binary is missing, or a component did not start or become ready."""


# --------------------------------------------------------------------------- binaries


def default_cache_dir() -> Path:
    """Where tests/controlplane/build.sh puts the binaries when HAMI_CONTROLPLANE_DIR is unset."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "hami" / "controlplane" / KUBERNETES_VERSION


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    #: optional: only the DRA tests start it (None when it was not built)
    kube_controller_manager: Path | None = None


def find_binaries(env: Mapping[str, str] | None = None) -> Binaries:
    """Locate etcd, kube-apiserver and kube-scheduler.

    Each binary comes from its own variable (HAMI_ETCD, HAMI_KUBE_APISERVER,
    HAMI_KUBE_SCHEDULER), else from HAMI_CONTROLPLANE_DIR, else from the build.sh cache.
    Raises ControlPlaneError naming every missing binary and how to get it.
    """
    env = os.environ if env is None else env
    base = Path(env[ENV_DIR]) if env.get(ENV_DIR) else default_cache_dir()
    found: dict[str, Path] = {}
    missing: list[str] = []
    for var, name in (
        (ENV_ETCD, "etcd"),
        (ENV_APISERVER, "kube-apiserver"),
        (ENV_SCHEDULER, "kube-scheduler"),
    ):
        path = Path(env[var]) if env.get(var) else base / name
        if path.is_file() and os.access(path, os.X_OK):
            found[name] = path
        else:
            missing.append(f"{name} (looked for {path})")
    if missing:
        raise ControlPlaneError(
            f"control plane binaries not found: {', '.join(missing)}; to fix: {FIX_HINT}"
        )
    kcm = (
        Path(env[ENV_CONTROLLER_MANAGER])
        if env.get(ENV_CONTROLLER_MANAGER)
        else base / "kube-controller-manager"
    )
    return Binaries(
        found["etcd"],
        found["kube-apiserver"],
        found["kube-scheduler"],
        kcm if kcm.is_file() and os.access(kcm, os.X_OK) else None,
    )


# --------------------------------------------------------------------------- certificates


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class CertificateAuthority:
    """A throwaway CA (ECDSA P-256) that signs serving and client certificates."""

    def __init__(self, common_name: str = "hami-test-ca") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        hosts: Sequence[str] = (),
        client: bool = False,
        server: bool = False,
    ) -> tuple[bytes, bytes]:
        """Return (certificate PEM, private key PEM) signed by this CA.

        `hosts` become subject alternative names (IP addresses or DNS names); a webhook
        served on 127.0.0.1 needs `hosts=["127.0.0.1", "localhost"], server=True`.
        """
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        now = dt.datetime.now(dt.UTC)
        usages = []
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # Python 3.13's default VERIFY_X509_STRICT wants the key identifiers
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if usages:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        if hosts:
            sans: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    sans.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, chosen below the kernel's
    ephemeral range: a port the kernel hands out itself (bind to 0) can be taken by any
    outgoing connection before our server binds it (seen: "address already in use" in a
    full run with many API clients), one outside that range only by another listener."""
    low, _high = _ephemeral_range()
    for _ in range(50):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _load_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


# Looked up here, in the parent: the child runs only async-signal-safe work before exec.
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # The child gets SIGKILL when the *thread* that started it ends, so a SIGKILLed test run
    # does not leave etcd or kube-apiserver running. Start components from a thread that
    # lives as long as they should (the main thread, or the event loop's thread).
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_live: set[ManagedProcess] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        proc.stop(timeout=5)


class ManagedProcess:
    """One component: started in its own process group, output to a log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    def start(self) -> None:
        if self.running():
            raise ControlPlaneError(f"{self.name} is already running")
        with open(self.log_path, "ab") as log:
            log.write(f"--- starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        with _live_lock:
            _live.add(self)

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen else None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL after `timeout` seconds."""
        proc = self._popen
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        with _live_lock:
            _live.discard(self)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def fail(self, what: str) -> ControlPlaneError:
        code = self.returncode()
        state = f"exited with code {code}" if code is not None else "still running"
        return ControlPlaneError(
            f"{self.name} {what} ({state}); log {self.log_path}, last lines:\n{self.log_tail()}"
        )


def _wait_ready(proc: ManagedProcess, url: str, ctx: ssl.SSLContext | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not proc.running():
            raise proc.fail(f"stopped before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
                body = resp.read().decode(errors="replace")
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}: {body[:300]}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read().decode(errors='replace')[-600:]}"
        except (OSError, ssl.SSLError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise proc.fail(f"not ready after {timeout:.0f}s at {url} (last answer: {last})")


def _wait_ready_or_stop(
    proc: ManagedProcess, plane: ControlPlane, url: str, timeout: float
) -> None:
    """``_wait_ready`` with the admin client certificate (the API server's clients need it
    for their health endpoints); a process that does not get ready is stopped."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(plane.admin_cert_path, plane.admin_key_path)
    try:
        _wait_ready(proc, url, ctx, timeout)
    except BaseException:
        proc.stop()
        raise


def _post_json(url: str, body: Mapping[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


# --------------------------------------------------------------------------- scheduler


class SchedulerProcess:
    """A kube-scheduler started with a caller-supplied KubeSchedulerConfiguration."""

    def __init__(self, plane: ControlPlane, config: Mapping[str, Any] | str, name: str) -> None:
        self._plane = plane
        self.name = name
        self.config = complete_scheduler_config(config, plane.kubeconfig)
        self.config_path = plane.workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.port = free_port()
        kubeconfig = str(plane.kubeconfig)
        argv = [
            str(plane.binaries.kube_scheduler),
            f"--config={self.config_path}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={plane.workdir / (name + '-certs')}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--v=2",
        ]
        self.process = ManagedProcess(name, argv, plane.workdir / f"{name}.log")

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def start(self, timeout: float = 60.0) -> None:
        """Start and wait for /readyz (a leader-less scheduler is ready once its informers
        have synced)."""
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process without waiting (then `wait_ready`, e.g. in a worker thread)."""
        self.process.start()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until /readyz answers 200; stop the process and raise if it does not."""
        _wait_ready_or_stop(
            self.process, self._plane, f"https://127.0.0.1:{self.port}/readyz", timeout
        )

    def stop(self) -> None:
        self.process.stop()

    def restart(self, timeout: float = 60.0) -> None:
        self.stop()
        self.start(timeout)

    def running(self) -> bool:
        return self.process.running()

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines)


def complete_scheduler_config(config: Mapping[str, Any] | str, kubeconfig: Path) -> dict[str, Any]:
    """Fill in what every test scheduler needs: apiVersion/kind, the kubeconfig, no leader
    election. Fields the caller set are kept."""
    data: Any = (
        yaml.safe_load(config) if isinstance(config, str) else json.loads(json.dumps(config))
    )
    if not isinstance(data, dict):
        raise ControlPlaneError("KubeSchedulerConfiguration must be a mapping")
    data.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
    data.setdefault("kind", "KubeSchedulerConfiguration")
    data.setdefault("clientConnection", {}).setdefault("kubeconfig", str(kubeconfig))
    data.setdefault("leaderElection", {}).setdefault("leaderElect", False)
    return data


# --------------------------------------------------------------------------- controller manager


class ControllerManagerProcess:
    """kube-controller-manager running only the named controllers (no leader election)."""

    def __init__(self, plane: ControlPlane, controllers: Sequence[str], name: str) -> None:
        binary = plane.binaries.kube_controller_manager
        if binary is None:
            raise ControlPlaneError(
                "kube-controller-manager not found (the DRA tests run its resourceclaim "
                f"controller); to fix: {FIX_HINT}, or set {ENV_CONTROLLER_MANAGER}"
            )
        self._plane = plane
        self.name = name
        self.controllers = list(controllers)
        self.port = free_port()
        kubeconfig = str(plane.kubeconfig)
        argv = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--controllers={','.join(self.controllers)}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={plane.workdir / (name + '-certs')}",
            # the admin credentials: no per-controller service accounts to create first
            "--use-service-account-credentials=false",
            "--v=2",
        ]
        self.process = ManagedProcess(name, argv, plane.workdir / f"{name}.log")

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def start(self, timeout: float = 60.0) -> None:
        self.process.start()
        _wait_ready_or_stop(
            self.process, self._plane, f"https://127.0.0.1:{self.port}/healthz", timeout
        )

    def stop(self) -> None:
        self.process.stop()

    def running(self) -> bool:
        return self.process.running()

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines)


# --------------------------------------------------------------------------- control plane


class ControlPlane:
    """etcd + kube-apiserver on free loopback ports, with generated certificates.

    Attributes after start(): `server` (https URL), `kubeconfig` (path), `ca` (the
    CertificateAuthority trusted by the API server for clients; use `ca.issue` for webhook
    serving certificates and `ca.cert_pem` as the webhook caBundle), `startup_seconds`.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        binaries: Binaries | None = None,
        extra_apiserver_args: Sequence[str] = (),
    ) -> None:
        self.binaries = binaries or find_binaries()
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="hami-cp-", dir="/tmp"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.ca = CertificateAuthority()
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.ca_path = self.workdir / "ca.crt"
        self.admin_cert_path = self.workdir / "admin.crt"
        self.admin_key_path = self.workdir / "admin.key"
        self.startup_seconds: float | None = None
        self.etcd: ManagedProcess | None = None
        self.apiserver: ManagedProcess | None = None
        self.schedulers: list[SchedulerProcess] = []
        self.controller_managers: list[ControllerManagerProcess] = []

    # -- lifecycle

    def start(self, timeout: float = 90.0) -> None:
        began = time.monotonic()
        try:
            self._write_credentials()
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
            self._write_kubeconfig()
        except BaseException:
            self.stop(remove_workdir=False)  # keep the logs named in the error
            raise
        self.startup_seconds = time.monotonic() - began

    def stop(self, remove_workdir: bool | None = None) -> None:
        """Stop every component (schedulers first); remove the work dir if we made it."""
        for sched in self.schedulers:
            sched.stop()
        self.schedulers.clear()
        for cm in self.controller_managers:
            cm.stop()
        self.controller_managers.clear()
        for proc in (self.apiserver, self.etcd):
            if proc is not None:
                proc.stop()
        if remove_workdir if remove_workdir is not None else self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start_scheduler(
        self,
        config: Mapping[str, Any] | str,
        name: str | None = None,
        timeout: float = 60.0,
        wait: bool = True,
    ) -> SchedulerProcess:
        """Start kube-scheduler with this KubeSchedulerConfiguration (a dict or YAML text;
        `clientConnection.kubeconfig` and `leaderElection.leaderElect: false` are filled in
        when absent) and, unless `wait=False`, wait until it is ready. It is stopped with
        the control plane, or earlier with `.stop()`."""
        sched = SchedulerProcess(self, config, name or f"kube-scheduler-{len(self.schedulers)}")
        self.schedulers.append(sched)
        sched.launch()
        if wait:
            sched.wait_ready(timeout)
        return sched

    def start_controller_manager(
        self,
        controllers: Sequence[str] = (RESOURCE_CLAIM_CONTROLLER,),
        name: str | None = None,
        timeout: float = 60.0,
    ) -> ControllerManagerProcess:
        """Start kube-controller-manager with only `controllers` (by default the DRA
        resourceclaim controller) and wait for /healthz. Stopped with the control plane."""
        cm = ControllerManagerProcess(
            self, controllers, name or f"kube-controller-manager-{len(self.controller_managers)}"
        )
        self.controller_managers.append(cm)
        cm.start(timeout)
        return cm

    # -- pieces

    def _write_credentials(self) -> None:
        self.ca_path.write_bytes(self.ca.cert_pem)
        cert, key = self.ca.issue("kube-apiserver", hosts=["127.0.0.1", "localhost"], server=True)
        (self.workdir / "apiserver.crt").write_bytes(cert)
        (self.workdir / "apiserver.key").write_bytes(key)
        cert, key = self.ca.issue("admin", organizations=["system:masters"], client=True)
        self.admin_cert_path.write_bytes(cert)
        self.admin_key_path.write_bytes(key)
        sa_key = ec.generate_private_key(ec.SECP256R1())
        (self.workdir / "sa.key").write_bytes(_pem_key(sa_key))
        (self.workdir / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def _start_etcd(self, timeout: float) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        argv = [
            str(self.binaries.etcd),
            "--name=hami-test",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=hami-test={peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
        self.etcd = ManagedProcess("etcd", argv, self.workdir / "etcd.log")
        self.etcd.start()
        _wait_ready(self.etcd, f"{self.etcd_url}/health", None, timeout)

    def _start_apiserver(self, timeout: float) -> None:
        d = self.workdir
        argv = [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={d / 'apiserver-certs'}",
            f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={self.ca_path}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--profiling=false",
            *self.extra_apiserver_args,
        ]
        self.apiserver = ManagedProcess("kube-apiserver", argv, d / "kube-apiserver.log")
        self.apiserver.start()
        _wait_ready(self.apiserver, f"{self.server}/readyz", self.ssl_context(), timeout)

    def kill_apiserver(self) -> None:
        """SIGKILL kube-apiserver (a crash, not a graceful stop): every client's connection
        drops at once and every request fails until ``restart_apiserver``."""
        proc = self.apiserver
        if proc is None or not proc.running() or proc.pid is None:
            raise ControlPlaneError("kube-apiserver is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stop(timeout=5)  # reaps it

    def restart_apiserver(self, timeout: float = 90.0) -> float:
        """Start kube-apiserver again on the same port with the same certificates and data;
        returns the seconds it took to answer /readyz."""
        proc = self.apiserver
        if proc is None:
            raise ControlPlaneError("kube-apiserver was never started")
        began = time.monotonic()
        proc.start()
        _wait_ready(proc, f"{self.server}/readyz", self.ssl_context(), timeout)
        return time.monotonic() - began

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what kube-apiserver does every
        5 minutes); returns that revision. A later watch from an older resourceVersion then
        ends with a 410 Expired ERROR event, but only when the API server was started with
        `--watch-cache=false`: with the watch cache on, kube-apiserver serves old versions
        from its cache and answers 410 only once they fall out of the cache's window."""
        key = base64.b64encode(b"\0").decode()
        rng = _post_json(
            f"{self.etcd_url}/v3/kv/range", {"key": key, "range_end": key, "count_only": True}
        )
        revision = int(rng["header"]["revision"])
        _post_json(f"{self.etcd_url}/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: trusts the CA and presents the admin certificate."""
        ctx = ssl.create_default_context(cafile=str(self.ca_path))
        ctx.load_cert_chain(self.admin_cert_path, self.admin_key_path)
        return ctx

    def _write_kubeconfig(self) -> None:
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "hami-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64(self.ca_path),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate-data": b64(self.admin_cert_path),
                        "client-key-data": b64(self.admin_key_path),
                    },
                }
            ],
            "contexts": [
                {"name": "hami-test", "context": {"cluster": "hami-test", "user": "admin"}}
            ],
            "current-context": "hami-test",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
