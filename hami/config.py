"""The one YAML configuration file: typed sections, defaults, env overrides, validation.

Every error names the key path and what was expected, e.g.
``config key node.register_period: expected a duration like 30s or 1m, got 'soon'``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_origin, get_type_hints

import yaml

from hami.backends import registry
from hami.backends.base import BackendError, BackendSettings, ResourceNames
from hami.core.requests import DEVICE_POLICY_WORDS


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the expected value."""


@dataclass(frozen=True)
class Duration:
    """Seconds, written in YAML as a number or ``30s`` / ``5m`` / ``1h`` / ``250ms``."""

    seconds: float


@dataclass(frozen=True)
class LogConfig:
    level: str = "info"  # debug, info, warning, error
    format: str = "auto"  # auto (JSON unless on a terminal), json, console


@dataclass(frozen=True)
class HttpConfig:
    address: str = "0.0.0.0"
    port: int = 9394
    # every listener drops a client that has not sent its whole request (TLS handshake,
    # head, body) this long after connecting or after its previous answer
    request_timeout: Duration = Duration(5)
    # connections still owing a request; one more drops the oldest of them
    max_pending_connections: int = 256


@dataclass(frozen=True)
class MonitorConfig:
    """The per-container usage monitor (docs/node.md "Usage monitor")."""

    enabled: bool = True
    # empty: the hamicore.containers_dir of each enabled backend (what Allocate mounts)
    containers_dir: str = ""
    scan_period: Duration = Duration(5)  # Go HAMi's feedback period
    cleanup_grace: Duration = Duration(300)  # a gone pod's directory is removed after it
    feedback: bool = True  # HAMi's priority feedback (utilization_switch, recent_kernel)


@dataclass(frozen=True)
class DRANodeConfig:
    """Paths of the kubelet DRA plugin, for backends with ``mode: dra`` (docs/dra.md)."""

    plugins_dir: str = "/var/lib/kubelet/plugins"  # {plugins_dir}/{driver}/dra.sock
    registry_dir: str = "/var/lib/kubelet/plugins_registry"  # kubelet's plugin watcher
    cdi_dir: str = "/var/run/cdi"  # one CDI spec per prepared claim


@dataclass(frozen=True)
class NodeConfig:
    name: str = ""  # env NODE_NAME overrides
    register_period: Duration = Duration(30)
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    # advertise each device's NUMA node to kubelet (Go HAMi's enableNumaTopology): off, as
    # in Go HAMi, because kubelet's single-numa-node policy then rejects pods it would admit
    numa_topology: bool = False
    http: HttpConfig = HttpConfig(port=9394)
    monitor: MonitorConfig = MonitorConfig()
    dra: DRANodeConfig = DRANodeConfig()


@dataclass(frozen=True)
class WebhookConfig:
    enabled: bool = True
    address: str = "0.0.0.0"
    port: int = 9443
    # self: the role makes its CA and serving certificate, keeps them in secret_name and
    # patches configuration_name's caBundle; files / cert-manager: read cert_file, key_file
    # (mounted from a Secret someone else writes), reloaded when they change.
    tls_mode: str = "self"
    cert_file: str = "/etc/hami/tls/tls.crt"
    key_file: str = "/etc/hami/tls/tls.key"
    secret_name: str = "hami-scheduler-webhook-tls"
    namespace: str = ""  # empty: POD_NAMESPACE, else the service account's namespace
    service_name: str = "hami-scheduler"  # the Service the webhook is reached through
    configuration_name: str = "hami-webhook"  # the MutatingWebhookConfiguration
    hosts: str = ""  # extra names/IPs for the certificate, comma separated
    validity: Duration = Duration(365 * 24 * 3600)  # serving certificate; the CA lives 10x
    # set on pods asking for an NVIDIA device that name no RuntimeClass (Go HAMi's
    # devicePlugin.runtimeClassName); empty: left alone
    runtime_class_name: str = ""
    # extender or dra: the mode of device pods in namespaces without the label
    # hami.io/device-mode (docs/dra.md "Both modes on one cluster")
    device_mode: str = "extender"
    request_timeout: Duration = Duration(5)  # as HttpConfig's
    max_pending_connections: int = 256


@dataclass(frozen=True)
class LeaderElectionConfig:
    """A coordination.k8s.io Lease decides which replica writes (docs/operations.md)."""

    enabled: bool = False
    lease_name: str = "hami-scheduler"
    namespace: str = ""  # empty: POD_NAMESPACE, else the service account's namespace
    identity: str = ""  # empty: POD_NAME, else the host name
    # a standby takes over <= 15 s after the leader dies, with kube-scheduler's Lease on the
    # same timing (docs/operations.md "High availability" has the worst case)
    lease_duration: Duration = Duration(8)
    renew_deadline: Duration = Duration(5)
    retry_period: Duration = Duration(1)
    # "namespace/name" of kube-scheduler's Lease: lead only while this pod's kube-scheduler
    # holds it (its holder is "<pod name>_<uuid>"); empty: hami's own Lease alone decides.
    follow_kube_scheduler: str = ""


@dataclass(frozen=True)
class ExtenderTLSConfig:
    """TLS with client certificates for a remote extender (kube-scheduler's tlsConfig).
    All empty: plain HTTP, for the default loopback address only."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""  # clients must present a certificate signed by this CA

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.key_file or self.client_ca_file)


@dataclass(frozen=True)
class ExtenderConfig:
    """/filter, /bind and /explain: loopback by default (kube-scheduler shares the pod)."""

    address: str = "127.0.0.1"
    port: int = 9396
    tls: ExtenderTLSConfig = ExtenderTLSConfig()
    request_timeout: Duration = Duration(5)  # as HttpConfig's
    max_pending_connections: int = 256


@dataclass(frozen=True)
class SchedulerConfig:
    scheduler_name: str = "hami-scheduler"
    handshake_period: Duration = Duration(15)
    handshake_timeout: Duration = Duration(60)
    node_lock_timeout: Duration = Duration(300)
    bind_lock_wait: Duration = Duration(20)  # below kube-scheduler's extender timeout
    allocation_timeout: Duration = Duration(60)  # a bound pod not allocated by then is failed
    decision_timeout: Duration = Duration(90)  # an unbound decision stops counting after it
    # a filter decision (held in memory only) whose bind never comes is freed after it
    reservation_timeout: Duration = Duration(30)
    node_policy: str = "binpack"  # binpack, spread or defrag (hami.core.defragpolicy)
    device_policy: str = "spread"  # comma list: binpack, spread, numa, mutex, topology-aware
    # FilteringSucceed and BindingSucceed Events on every pod, as Go HAMi writes them: two
    # API writes per pod that kube-scheduler's own Scheduled Event already covers. Off:
    # only failures (aggregated) are written.
    success_events: bool = False
    # The decision rides on the pod's Binding (its annotations are merged into the pod with
    # nodeName, one write instead of two) where the bind holds the node lock and nothing
    # stale must be deleted. Off: it is written on the pod when /bind comes, before the
    # turn, so Go HAMi schedulers placing pods on the same nodes at the same time see it
    # earlier (docs/scheduler.md "The bind").
    decision_in_binding: bool = True
    # Under node_policy defrag: pods that ask for no device are routed to this scheduler
    # too (webhook) and placed where their CPU and memory strand the least GPU; needs the
    # extender called for every pod (kube-scheduler.yaml: no managedResources).
    defrag_cpu_pods: bool = False
    # Enforce ResourceQuota limits.<device memory/cores resource> (hami.core.quota), as Go
    # HAMi does; needs get/list/watch on resourcequotas.
    resource_quotas: bool = True
    # Devices the webhook gives a container that names only a device's memory, percentage or
    # cores (Go HAMi's nvidia.defaultGPUNum): without the count resource kubelet never calls
    # the device plugin and the container would run with no limits at all.
    default_device_count: int = 1
    # DRA mode (docs/dra.md "Scoring nodes in DRA mode"): serve /prioritize, ranking the
    # nodes kube-scheduler chooses between by the defrag policy's cost of the pod's claims
    # on backends with mode: dra; needs list/watch on resourceslices, resourceclaims and
    # resourceclaimtemplates, and kube-scheduler's extender entry with prioritizeVerb.
    dra_score: bool = False
    # Which per-device and per-container gauges /metrics carries (comma list; "" for
    # none): hami (hami_device_*, hami_node_available), go (Go HAMi's hami_gpu_*,
    # hami_node_gpu_*), pods (Go HAMi's per-container hami_vgpu_*). Each is kept as text
    # per node or pod: at 65,000 nodes all three are over 1 GB of text and of body.
    cluster_metrics: str = "hami,go,pods"
    http: HttpConfig = HttpConfig(port=9395)  # /healthz, /readyz, /metrics
    extender: ExtenderConfig = ExtenderConfig()
    webhook: WebhookConfig = WebhookConfig()
    leader_election: LeaderElectionConfig = LeaderElectionConfig()


@dataclass(frozen=True)
class BackendConfig:
    enabled: bool = True
    split_count: int = 10
    memory_scaling: float = 1.0
    core_scaling: float = 1.0
    register_format: str = "seed"  # seed (7-field form) or json (for Go HAMi >= 2.8 schedulers)
    # extender: node annotations + device plugin (protocol.md); dra: ResourceSlices + the
    # kubelet DRA plugin, kube-scheduler allocates (docs/dra.md)
    mode: str = "extender"
    resources: dict[str, Any] = field(default_factory=dict)  # overrides of resource names
    options: dict[str, Any] = field(default_factory=dict)  # every other key of the section

    def settings(self, name: str) -> BackendSettings:
        resources = None
        if self.resources:
            allowed = {f.name for f in dataclasses.fields(ResourceNames)}
            unknown = set(self.resources) - allowed
            if unknown:
                raise ConfigError(
                    f"config key backends.{name}.resources: unknown name(s) {sorted(unknown)}, "
                    f"expected some of {sorted(allowed)}"
                )
            if "count" not in self.resources:
                raise ConfigError(f"config key backends.{name}.resources.count is required")
            resources = ResourceNames(**self.resources)
        self._check_options(name)
        return BackendSettings(
            split_count=self.split_count,
            memory_scaling=self.memory_scaling,
            core_scaling=self.core_scaling,
            resources=resources,
            options=self.options,
            register_format=self.register_format,
        )

    def _check_options(self, name: str) -> None:
        """A typo in a backend's own keys reads like one in any other key."""
        try:
            known = registry.load_class(name).known_options
        except BackendError:
            return  # an unknown or broken backend: creating it says so
        if known is None:
            return
        unknown = sorted(set(map(str, self.options)) - known)
        if unknown:
            shared = {f.name for f in dataclasses.fields(self)} - {"options"}
            raise ConfigError(
                f"config key backends.{name}.{unknown[0]}: unknown key; known keys here are "
                f"{', '.join(sorted(shared | known))}"
            )


def _default_backends() -> dict[str, BackendConfig]:
    return {
        "nvidia": BackendConfig(),
        "mlu": BackendConfig(enabled=False),
        "fake": BackendConfig(enabled=False),
    }


@dataclass(frozen=True)
class Config:
    log: LogConfig = LogConfig()
    kubeconfig: str = ""  # empty: in-cluster, else $KUBECONFIG, else ~/.kube/config
    node: NodeConfig = NodeConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    backends: dict[str, BackendConfig] = field(default_factory=_default_backends)

    def enabled_backends(self) -> dict[str, BackendConfig]:
        return {name: b for name, b in self.backends.items() if b.enabled}


LOG_LEVELS = ("debug", "info", "warning", "error")
_CHOICES: dict[str, tuple[str, ...]] = {
    "log.level": LOG_LEVELS,
    "log.format": ("auto", "json", "console"),
    "scheduler.node_policy": ("binpack", "spread", "defrag"),
}
WEBHOOK_TLS_MODES = ("self", "files", "cert-manager")
BACKEND_MODES = ("extender", "dra")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def load(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Read ``path`` (None: defaults only), then apply environment overrides."""
    raw: Any = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    return from_mapping(raw, env=os.environ if env is None else env)


def from_mapping(raw: Any, env: Mapping[str, str] | None = None) -> Config:
    if not isinstance(raw, Mapping):
        raise ConfigError("config: the top level must be a mapping of sections")
    raw = dict(raw)
    backends_raw = raw.pop("backends", None)
    config = _build(Config, raw, "")
    if backends_raw is not None:
        config = dataclasses.replace(config, backends=_backends(backends_raw))
    config = _apply_env(config, env or {})
    _check(config)
    return config


def _backends(raw: Any) -> dict[str, BackendConfig]:
    if not isinstance(raw, Mapping):
        raise ConfigError("config key backends: expected a mapping of backend name to settings")
    merged = _default_backends()
    for name, section in raw.items():
        section = {} if section is None else section
        if not isinstance(section, Mapping):
            raise ConfigError(f"config key backends.{name}: expected a mapping")
        common = {f.name for f in dataclasses.fields(BackendConfig)} - {"options"}
        known = {k: v for k, v in section.items() if k in common}
        options = {k: v for k, v in section.items() if k not in common}
        known["options"] = options
        merged[str(name)] = _build(BackendConfig, known, f"backends.{name}")
    return merged


def _apply_env(config: Config, env: Mapping[str, str]) -> Config:
    node_name = env.get("NODE_NAME")
    if node_name:
        config = dataclasses.replace(config, node=dataclasses.replace(config.node, name=node_name))
    level = env.get("HAMI_LOG_LEVEL")
    if level:
        config = dataclasses.replace(config, log=dataclasses.replace(config.log, level=level))
    kubeconfig = env.get("HAMI_KUBECONFIG")
    if kubeconfig:
        config = dataclasses.replace(config, kubeconfig=kubeconfig)
    return config


def _check_device_policy(value: str) -> None:
    """A comma list of Go HAMi's device policy words (``binpack,numa``), as a pod's
    ``hami.io/gpu-scheduler-policy`` (docs/scheduler.md)."""
    words = [word.strip() for word in value.split(",")]
    if not all(word in DEVICE_POLICY_WORDS for word in words):
        raise ConfigError(
            "config key scheduler.device_policy: expected a comma list of "
            f"{', '.join(DEVICE_POLICY_WORDS)} (e.g. spread or binpack,numa), got {value!r}"
        )


CLUSTER_METRICS = ("hami", "go", "pods")


def cluster_metric_groups(value: str) -> frozenset[str]:
    """The words of ``scheduler.cluster_metrics`` ("" and "none": no group)."""
    words = {word.strip() for word in value.split(",")} - {"", "none"}
    return frozenset(words)


def _check_cluster_metrics(value: str) -> None:
    unknown = sorted(cluster_metric_groups(value) - set(CLUSTER_METRICS))
    if unknown:
        raise ConfigError(
            "config key scheduler.cluster_metrics: expected a comma list of "
            f"{', '.join(CLUSTER_METRICS)} (or none), got {value!r}"
        )


def _check(config: Config) -> None:
    for key, choices in _CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if value not in choices:
            raise ConfigError(
                f"config key {key}: expected one of {', '.join(choices)}, got {value!r}"
            )
    _check_device_policy(config.scheduler.device_policy)
    _check_cluster_metrics(config.scheduler.cluster_metrics)
    if config.scheduler.defrag_cpu_pods and config.scheduler.node_policy != "defrag":
        raise ConfigError(
            "config key scheduler.defrag_cpu_pods: needs scheduler.node_policy: defrag "
            f"(got {config.scheduler.node_policy!r}); set both, or drop defrag_cpu_pods"
        )
    if config.scheduler.dra_score and not any(
        b.mode == "dra" for b in config.enabled_backends().values()
    ):
        raise ConfigError(
            "config key scheduler.dra_score: needs an enabled backend with mode: dra (the "
            "score ranks nodes by the claims on hami's DRA drivers); set one, or drop dra_score"
        )
    for key, duration in (
        ("node.register_period", config.node.register_period),
        ("node.monitor.scan_period", config.node.monitor.scan_period),
        ("node.monitor.cleanup_grace", config.node.monitor.cleanup_grace),
        ("scheduler.handshake_period", config.scheduler.handshake_period),
        ("scheduler.handshake_timeout", config.scheduler.handshake_timeout),
        ("scheduler.node_lock_timeout", config.scheduler.node_lock_timeout),
        ("scheduler.allocation_timeout", config.scheduler.allocation_timeout),
    ):
        if duration.seconds <= 0:
            raise ConfigError(f"config key {key}: expected a positive duration")
    if config.scheduler.decision_timeout.seconds <= config.scheduler.bind_lock_wait.seconds:
        raise ConfigError(
            "config key scheduler.decision_timeout: must be longer than "
            "scheduler.bind_lock_wait (a pod being bound would lose its devices); "
            "keep it well above bind_lock_wait plus kube-scheduler's extender httpTimeout"
        )
    _check_webhook_and_election(config.scheduler)
    _check_listeners(config)
    if config.scheduler.default_device_count < 1:
        raise ConfigError(
            "config key scheduler.default_device_count: expected an integer >= 1 (a container "
            "that names only memory or cores must get a device count, or kubelet never "
            "calls the device plugin and no limit applies)"
        )
    if config.scheduler.reservation_timeout.seconds < config.scheduler.bind_lock_wait.seconds:
        raise ConfigError(
            "config key scheduler.reservation_timeout: must be at least "
            "scheduler.bind_lock_wait (pods kube-scheduler is about to bind would lose their "
            "devices sooner than a bind may wait for its node); keep it above the time "
            "kube-scheduler takes from filter to bind (PreBind plugins such as volume binding)"
        )
    tls = config.scheduler.extender.tls
    if tls.enabled and not (tls.cert_file and tls.key_file and tls.client_ca_file):
        raise ConfigError(
            "config key scheduler.extender.tls: set cert_file, key_file and client_ca_file "
            "together (a TLS extender requires client certificates), or none of them"
        )
    for name, backend in config.backends.items():
        if backend.split_count < 1:
            raise ConfigError(f"config key backends.{name}.split_count: expected an integer >= 1")
        for key in ("memory_scaling", "core_scaling"):
            if getattr(backend, key) <= 0:
                raise ConfigError(f"config key backends.{name}.{key}: expected a number > 0")
        if backend.mode not in BACKEND_MODES:
            raise ConfigError(
                f"config key backends.{name}.mode: expected one of {', '.join(BACKEND_MODES)}, "
                f"got {backend.mode!r}"
            )
        if backend.register_format not in ("seed", "json"):
            raise ConfigError(
                f"config key backends.{name}.register_format: expected seed or json, "
                f"got {backend.register_format!r}"
            )


def _check_listeners(config: Config) -> None:
    listeners: tuple[tuple[str, HttpConfig | ExtenderConfig | WebhookConfig], ...] = (
        ("node.http", config.node.http),
        ("scheduler.http", config.scheduler.http),
        ("scheduler.extender", config.scheduler.extender),
        ("scheduler.webhook", config.scheduler.webhook),
    )
    for key, listener in listeners:
        if listener.request_timeout.seconds <= 0:
            raise ConfigError(f"config key {key}.request_timeout: expected a positive duration")
        if listener.max_pending_connections < 1:
            raise ConfigError(f"config key {key}.max_pending_connections: expected an integer >= 1")


def _check_webhook_and_election(scheduler: SchedulerConfig) -> None:
    hook = scheduler.webhook
    if hook.tls_mode not in WEBHOOK_TLS_MODES:
        raise ConfigError(
            "config key scheduler.webhook.tls_mode: expected one of "
            f"{', '.join(WEBHOOK_TLS_MODES)}, got {hook.tls_mode!r}"
        )
    if hook.validity.seconds < 10:
        raise ConfigError("config key scheduler.webhook.validity: expected at least 10s")
    if hook.device_mode not in ("extender", "dra"):
        raise ConfigError(
            "config key scheduler.webhook.device_mode: expected extender or dra, got "
            f"{hook.device_mode!r}"
        )
    election = scheduler.leader_election
    for key in ("lease_duration", "renew_deadline", "retry_period"):
        if getattr(election, key).seconds <= 0:
            raise ConfigError(
                f"config key scheduler.leader_election.{key}: expected a positive duration"
            )
    if not (
        election.retry_period.seconds
        < election.renew_deadline.seconds
        < election.lease_duration.seconds
    ):
        raise ConfigError(
            "config key scheduler.leader_election: expected retry_period < renew_deadline < "
            "lease_duration (a leader must give up before a standby may take the lease), got "
            f"{election.retry_period.seconds:g}s, {election.renew_deadline.seconds:g}s, "
            f"{election.lease_duration.seconds:g}s"
        )


def _build(cls: type[Any], raw: Any, path: str) -> Any:
    where = path or "(top level)"
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config key {where}: expected a mapping, got {raw!r}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(map(str, raw)) - set(fields))
    if unknown:
        raise ConfigError(
            f"config key {_join(path, unknown[0])}: unknown key; known keys here are "
            f"{', '.join(sorted(fields))}"
        )
    values: dict[str, Any] = {}
    for name, value in raw.items():
        values[name] = _convert(hints[name], value, _join(path, name), fields[name])
    return cls(**values)


def _convert(hint: Any, value: Any, path: str, fld: dataclasses.Field[Any] | None) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and hint is not Duration:
        base: Any = None if fld is None or _missing(fld.default) else fld.default
        built = _build(hint, value, path)
        if base is not None and isinstance(value, Mapping):
            # Keep the section's own defaults (e.g. a different port) for keys not given.
            return dataclasses.replace(base, **{k: getattr(built, k) for k in value})
        return built
    if hint is Duration:
        return _duration(value, path)
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return value
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key {path}: expected a mapping, got {value!r}")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key {path}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {path}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"config key {path}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"config key {path}: expected a string, got {value!r}")
        return str(value)
    raise ConfigError(f"config key {path}: unsupported setting")  # pragma: no cover


def _duration(value: Any, path: str) -> Duration:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Duration(float(value))
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return Duration(float(match.group(1)) * _UNIT_SECONDS[match.group(2)])
    raise ConfigError(f"config key {path}: expected a duration like 30s or 1m, got {value!r}")


def _missing(value: Any) -> bool:
    return value is dataclasses.MISSING


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
