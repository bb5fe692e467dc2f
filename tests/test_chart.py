"""The Helm chart charts/hami: helm lint, helm template with the defaults and with a values
file written with Go HAMi's value names (tests/data/hami-values.yaml), the values schema,
the names both configs share, and a server-side dry-run of every rendered object with
strict field validation on the real API server. docker/manifests must be the chart's
rendering (scripts/gen-manifests.sh), so the two cannot drift.

helm is built by `make controlplane` into the control-plane cache (tests/controlplane/build.sh).
"""

from __future__ import annotations

import asyncio
import contextlib
import filecmp
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from _manifest_helpers import apply, object_path
from test_admission_policy import As, allowed, denied

from hami import config
from hami.backends import registry
from hami.kube.client import Kube
from hami.kube.raw import Conflict, KubeError, NotFound
from hami.testkit.controlplane import ENV_DIR, KUBERNETES_VERSION, default_cache_dir

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "hami"
HAMI_VALUES = ROOT / "tests" / "data" / "hami-values.yaml"
# A typical Go HAMi values file, and the keys of Go HAMi's own values.yaml (its commit named
# in the file): docs/operations.md must give each a verdict.
GOHAMI_VALUES = ROOT / "tests" / "data" / "gohami-typical-values.yaml"
GOHAMI_KEYS = ROOT / "tests" / "data" / "gohami-values-keys.txt"
OPERATIONS = ROOT / "docs" / "operations.md"
# What a cluster tells helm and `helm template` cannot know.
SERVICE_MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"

Docs = list[dict[str, Any]]


def helm_binary() -> Path:
    if os.environ.get("HELM"):
        return Path(os.environ["HELM"])
    base = Path(os.environ[ENV_DIR]) if os.environ.get(ENV_DIR) else default_cache_dir()
    return base / "helm"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = helm_binary()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(
            f"helm not found at {binary}: run `make controlplane` (tests/controlplane/build.sh) "
            "or set HELM to a helm binary",
            pytrace=False,
        )
    result = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{result.stderr}", pytrace=False)
    return result


def render(
    *args: str, release: str = "hami", namespace: str = "hami-system", chart: Path = CHART
) -> Docs:
    out = helm(
        "template", release, str(chart), "--namespace", namespace,
        "--kube-version", KUBERNETES_VERSION, *args,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_key(docs: Docs) -> dict[tuple[str, str], dict[str, Any]]:
    keyed = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(keyed) == len(docs), "two objects of one kind share a name"
    return keyed


def fullname(release: str) -> str:
    """The chart's name prefix: the release's name when it holds "hami", else release-hami."""
    return release if "hami" in release else f"{release}-hami"


def configs(docs: Docs, release: str = "hami") -> tuple[config.Config, dict[str, Any]]:
    """hami.yaml (loaded by hami's own config loader) and kube-scheduler's configuration."""
    objs = by_key(docs)
    prefix = fullname(release)
    hami_cfg = config.from_mapping(
        yaml.safe_load(objs[("ConfigMap", f"{prefix}-config")]["data"]["hami.yaml"]), env={}
    )
    sched = yaml.safe_load(
        objs[("ConfigMap", f"{prefix}-kube-scheduler")]["data"]["kube-scheduler.yaml"]
    )
    return hami_cfg, sched


def pod_spec(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = by_key(docs)[(kind, name)]["spec"]["template"]["spec"]
    return spec


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name)


DEFAULTS = ("hami", "hami-system", ())
HAMI_STYLE = ("vgpu", "gpu-system", ("-f", str(HAMI_VALUES), "--api-versions", SERVICE_MONITOR_API))


# --------------------------------------------------------------------------- lint, schema


@pytest.mark.parametrize(
    "values",
    [
        (),
        ("-f", str(HAMI_VALUES)),
        ("--set", "devicePlugin.mode=dra"),
        ("--set", "devicePlugin.mode=dra", "--set", "scheduler.draScore.enabled=true"),
        ("-f", str(GOHAMI_VALUES)),
    ],
    ids=["defaults", "hami", "dra", "dra-score", "gohami"],
)
def test_helm_lint_is_clean(values: tuple[str, ...]) -> None:
    result = helm("lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("scheduler.leaderElekt=true", ["/scheduler", "leaderElekt"]),
        ("scheduler.leaderElection.leaseDuration=8", ["leaseDuration"]),  # no unit
        ("scheduler.leaderElection.retryPeriod=1.5s", ["retryPeriod"]),  # whole seconds
        ("devicePlugin.deviceSplitCont=4", ["/devicePlugin", "deviceSplitCont"]),
        ("resouceName=nvidia.com/gpu", ["resouceName"]),
        ("devicePlugin.deviceSplitCount=ten", ["/devicePlugin/deviceSplitCount", "integer"]),
        ("scheduler.admissionWebhook.failurePolicy=Maybe", ["failurePolicy"]),
        ("scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy=tightest", ["gpuSchedulerPolicy"]),
        ("devicePlugin.mode=DRA", ["/devicePlugin/mode"]),
    ],
)
def test_schema_rejects_typos_and_bad_values(setting: str, words: list[str]) -> None:
    result = helm("template", "hami", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, result.stdout
    for word in words:
        assert word in result.stderr, result.stderr


def test_a_priority_resource_hami_does_not_read_is_refused() -> None:
    # hami's backend reads the task priority from nvidia.com/priority only: a renamed one
    # would reach kube-scheduler but never HAMi-core, so the schema refuses it.
    result = helm("template", "hami", str(CHART), "--set", "resourcePriority=x.com/p", check=False)
    assert result.returncode != 0
    assert "resourcePriority" in result.stderr


# --------------------------------------------------------------------------- docker/manifests


def test_docker_manifests_are_the_charts_rendering(tmp_path: Path) -> None:
    env = {**os.environ, "HELM": str(helm_binary())}
    helm("version")  # fails with the fix when helm is missing
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-manifests.sh"), str(tmp_path)],
        env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    committed = ROOT / "docker" / "manifests"
    names = sorted(p.name for p in tmp_path.glob("*.yaml"))
    assert names == sorted(p.name for p in committed.glob("*.yaml"))
    _, mismatch, errors = filecmp.cmpfiles(committed, tmp_path, names, shallow=False)
    assert not mismatch and not errors, (
        f"docker/manifests differ from the chart in {mismatch + errors}: run `make manifests`"
    )


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize(("release", "namespace", "args"), [DEFAULTS, HAMI_STYLE])
def test_scheduler_and_resource_names_agree_in_both_configs(
    release: str, namespace: str, args: tuple[str, ...]
) -> None:
    docs = render(*args, release=release, namespace=namespace)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if args:
        values.update(yaml.safe_load(HAMI_VALUES.read_text()))
    hami_cfg, sched = configs(docs, release)
    assert sched["profiles"][0]["schedulerName"] == hami_cfg.scheduler.scheduler_name
    assert hami_cfg.scheduler.scheduler_name == values["schedulerName"]
    (extender,) = sched["extenders"]
    assert extender["urlPrefix"] == f"http://127.0.0.1:{hami_cfg.scheduler.extender.port}"
    managed = [r["name"] for r in extender["managedResources"] if r["ignoredByScheduler"]]
    assert len(managed) == len(set(managed)), managed
    nvidia = registry.create("nvidia", hami_cfg.backends["nvidia"].settings("nvidia"))
    assert nvidia.resources.all() == [
        values[k] for k in ("resourceName", "resourceMem", "resourceMemPercentage", "resourceCores")
    ]
    mlu = registry.create("mlu", hami_cfg.backends["mlu"].settings("mlu"))
    assert mlu.resources.count == values["mluResourceName"]
    # every resource either backend answers for, and the task priority, go to the extender
    assert nvidia.priority_resource == values["resourcePriority"]
    expected = [*nvidia.resources.all(), values["resourcePriority"], *mlu.resources.all()]
    assert sorted(managed) == sorted(expected)


def test_defaults_render_the_deployment() -> None:
    docs = render()
    objs = by_key(docs)
    hami_cfg, sched = configs(docs)
    assert sched["leaderElection"] == {
        "leaderElect": True,
        "resourceNamespace": "hami-system",
        "resourceName": "hami-kube-scheduler",
        "leaseDuration": "8s",
        "renewDeadline": "5s",
        "retryPeriod": "1s",
    }
    # hami's own Lease, held only while this pod's kube-scheduler leads (docs/operations.md),
    # on the same timing as kube-scheduler's
    election = hami_cfg.scheduler.leader_election
    assert (election.enabled, election.lease_name) == (True, "hami-scheduler")
    timing = (election.lease_duration, election.renew_deadline, election.retry_period)
    assert tuple(d.seconds for d in timing) == (8, 5, 1)
    assert election.follow_kube_scheduler == "hami-system/hami-kube-scheduler"
    deployment = objs[("Deployment", "hami-scheduler")]["spec"]
    assert deployment["replicas"] == 2
    spec = deployment["template"]["spec"]
    # kube-scheduler's tag follows the cluster's version
    assert container(spec, "kube-scheduler")["image"] == (
        f"registry.k8s.io/kube-scheduler:{KUBERNETES_VERSION}"
    )
    assert container(spec, "hami")["image"] == "ghcr.io/hami-py/hami:0.1.0"
    assert "imagePullSecrets" not in spec
    node = pod_spec(docs, "DaemonSet", "hami-node")
    assert node["nodeSelector"] == {"gpu": "on"}
    assert "runtimeClassName" not in node
    backend = hami_cfg.backends["nvidia"]
    assert (backend.split_count, backend.memory_scaling, backend.core_scaling) == (10, 1, 1)
    webhook = objs[("MutatingWebhookConfiguration", "hami-webhook")]["webhooks"][0]
    assert webhook["failurePolicy"] == "Ignore"
    assert "caBundle" not in webhook["clientConfig"]  # the scheduler patches it; upgrades keep it
    excluded = webhook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert excluded == ["kube-system", "hami-system"]
    # Go HAMi's default: no ServiceMonitor unless asked for (and the CRD is there)
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert not [d for d in docs if d["kind"] == "Namespace"]


def test_hami_style_values_carry_over() -> None:
    release, namespace, args = HAMI_STYLE
    docs = render(*args, release=release, namespace=namespace)
    objs = by_key(docs)
    hami_cfg, sched = configs(docs, release)
    assert hami_cfg.scheduler.node_policy == "spread"
    assert hami_cfg.scheduler.device_policy == "binpack"
    assert hami_cfg.scheduler.node_lock_timeout.seconds == 120
    backend = hami_cfg.backends["nvidia"]
    assert (backend.split_count, backend.memory_scaling, backend.core_scaling) == (4, 1.5, 2)
    assert sched["leaderElection"]["leaderElect"] is True
    assert sched["leaderElection"]["resourceNamespace"] == namespace
    kube_lease = f"{namespace}/{sched['leaderElection']['resourceName']}"
    assert hami_cfg.scheduler.leader_election.follow_kube_scheduler == kube_lease
    assert hami_cfg.scheduler.leader_election.lease_name == "vgpu-hami-scheduler"
    assert hami_cfg.scheduler.webhook.configuration_name == "vgpu-hami-webhook"
    deployment = objs[("Deployment", "vgpu-hami-scheduler")]["spec"]
    assert deployment["replicas"] == 3
    spec = deployment["template"]["spec"]
    assert container(spec, "kube-scheduler")["image"] == (
        "mirror.example.com/kube-scheduler:v1.35.1"  # a set tag wins over the cluster's
    )
    assert container(spec, "hami")["image"] == "mirror.example.com/hami-py/hami:0.1.0"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other-cred"}]
    node = pod_spec(docs, "DaemonSet", "vgpu-hami-node")
    assert node["runtimeClassName"] == "nvidia"
    # helm merges maps with the defaults, as with Go HAMi's chart (`gpu: null` drops it)
    assert node["nodeSelector"] == {"gpu": "on", "nvidia.com/gpu.present": "true"}
    assert container(node, "install-hami-core")["image"].startswith("mirror.example.com/")
    webhook = objs[("MutatingWebhookConfiguration", "vgpu-hami-webhook")]["webhooks"][0]
    assert webhook["failurePolicy"] == "Fail"
    excluded = webhook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert excluded == ["kube-system", namespace, "istio-system", "monitoring"]
    service = webhook["clientConfig"]["service"]
    assert (service["name"], service["namespace"]) == ("vgpu-hami-scheduler", namespace)
    assert ("Service", "vgpu-hami-scheduler") in objs
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["namespace"] == namespace
    # the admission policies name this release's service accounts
    policy = objs[("ValidatingAdmissionPolicy", "vgpu-hami-node-scope")]
    (condition,) = policy["spec"]["matchConditions"]
    assert f"system:serviceaccount:{namespace}:vgpu-hami-node" in condition["expression"]


def test_without_leader_election_one_replica_is_recreated() -> None:
    docs = render("--set", "scheduler.leaderElect=false", "--set", "scheduler.replicas=3")
    hami_cfg, sched = configs(docs)
    assert sched["leaderElection"]["leaderElect"] is False
    assert hami_cfg.scheduler.leader_election.enabled is False
    deployment = by_key(docs)[("Deployment", "hami-scheduler")]["spec"]
    assert deployment["replicas"] == 1
    assert deployment["strategy"] == {"type": "Recreate"}


def _rules(role: dict[str, Any], resource: str) -> list[dict[str, Any]]:
    return [r for r in role["rules"] if resource in r["resources"]]


def test_self_provisioned_certificate_has_just_the_rights_it_needs() -> None:
    objs = by_key(render())
    role = objs[("Role", "hami-scheduler")]
    secrets = _rules(role, "secrets")
    assert {"verbs": ["create"]} in [
        {"verbs": r["verbs"]} for r in secrets if "resourceNames" not in r
    ]
    (named,) = [r for r in secrets if "resourceNames" in r]
    assert named["resourceNames"] == ["hami-scheduler-tls"]
    assert sorted(named["verbs"]) == ["get", "update"]
    (webhooks,) = _rules(objs[("ClusterRole", "hami-scheduler")], "mutatingwebhookconfigurations")
    assert webhooks["resourceNames"] == ["hami-webhook"]
    assert sorted(webhooks["verbs"]) == ["get", "patch"]
    hami_cfg, _ = configs(list(objs.values()))
    hook = hami_cfg.scheduler.webhook
    assert hook.tls_mode == "self"
    assert (hook.secret_name, hook.configuration_name) == ("hami-scheduler-tls", "hami-webhook")
    assert ("Service", hook.service_name) in objs
    spec = pod_spec(list(objs.values()), "Deployment", "hami-scheduler")
    # nothing mounted: it reads its Secret through the API and writes its files to /tmp
    assert "tls" not in {v["name"] for v in spec["volumes"]}
    assert "/tmp" in {m["mountPath"] for m in container(spec, "hami")["volumeMounts"]}
    assert not [k for k in objs if k[0] in ("Certificate", "Issuer")]


def test_cert_manager_makes_the_certificate_instead() -> None:
    docs = render("--set", "scheduler.certManager.enabled=true")
    objs = by_key(docs)
    certificate = objs[("Certificate", "hami-scheduler-serving-cert")]["spec"]
    assert certificate["secretName"] == "hami-scheduler-tls"
    assert "hami-scheduler.hami-system.svc" in certificate["dnsNames"]
    issuer = certificate["issuerRef"]["name"]
    assert objs[("Issuer", issuer)]["spec"] == {"selfSigned": {}}
    webhook = objs[("MutatingWebhookConfiguration", "hami-webhook")]
    assert webhook["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "hami-system/hami-scheduler-serving-cert"
    }
    # the scheduler needs no rights on Secrets or the webhook then
    assert not _rules(objs[("Role", "hami-scheduler")], "secrets")
    assert not _rules(objs[("ClusterRole", "hami-scheduler")], "mutatingwebhookconfigurations")
    hami_cfg, _ = configs(docs)
    assert hami_cfg.scheduler.webhook.tls_mode == "cert-manager"
    spec = pod_spec(docs, "Deployment", "hami-scheduler")
    volume = next(v for v in spec["volumes"] if v["name"] == "tls")
    assert volume["secret"] == {"secretName": "hami-scheduler-tls"}
    mounts = {m["name"]: m["mountPath"] for m in container(spec, "hami")["volumeMounts"]}
    assert mounts["tls"] == str(Path(hami_cfg.scheduler.webhook.cert_file).parent)


def test_dashboards_config_map_has_the_grafana_sidecar_label(tmp_path: Path) -> None:
    chart = tmp_path / "hami"
    shutil.copytree(CHART, chart)
    (chart / "dashboards" / "probe.json").write_text('{"title": "probe"}\n')
    objs = by_key(render(chart=chart))
    dashboards = objs[("ConfigMap", "hami-dashboards")]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboards["data"]["probe.json"] == '{"title": "probe"}'
    shipped = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    assert sorted(dashboards["data"]) == sorted([*shipped, "probe.json"])
    off = by_key(render("--set", "dashboards.enabled=false", chart=chart))
    assert ("ConfigMap", "hami-dashboards") not in off


def test_config_value_merges_over_the_rendered_config() -> None:
    docs = render("--set", "config.scheduler.handshake_period=7s", "--set", "logLevel=debug")
    hami_cfg, _ = configs(docs)
    assert hami_cfg.scheduler.handshake_period.seconds == 7
    assert hami_cfg.log.level == "debug"
    assert hami_cfg.scheduler.scheduler_name == "hami-scheduler"  # the rest stays


def test_defrag_with_cpu_pods_asks_the_extender_about_every_pod() -> None:
    docs = render(
        "--set", "scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy=defrag",
        "--set", "config.scheduler.defrag_cpu_pods=true",
    )  # fmt: skip
    hami_cfg, sched = configs(docs)
    assert hami_cfg.scheduler.node_policy == "defrag" and hami_cfg.scheduler.defrag_cpu_pods
    (extender,) = sched["extenders"]
    assert "managedResources" not in extender  # called for pods without devices too
    (profile,) = sched["profiles"]
    (fit,) = profile["pluginConfig"]
    assert fit["name"] == "NodeResourcesFit"
    ignored = fit["args"]["ignoredResources"]
    assert {"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"} <= set(ignored)
    # without it: managedResources as before, no plugin config
    _, plain = configs(
        render("--set", "scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy=defrag")
    )
    assert plain["extenders"][0]["managedResources"]
    assert "pluginConfig" not in plain["profiles"][0]


# --------------------------------------------------------------------------- Go HAMi's values

GOHAMI_STYLE = ("vgpu", "gpu-system", ("-f", str(GOHAMI_VALUES)))


def _go_table() -> dict[str, str]:
    """Go HAMi key -> verdict, from the table in docs/operations.md "Go HAMi's values"."""
    text = OPERATIONS.read_text()
    section = text[text.index("### Go HAMi's values") :]
    section = section[: section.index("\n#", 1)]
    verdicts: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        for key in cells[0].split(","):
            verdicts[key.strip().split(" ")[0].strip("`")] = cells[1]
    return verdicts


def test_every_go_hami_value_has_a_verdict_in_the_docs() -> None:
    lines = GOHAMI_KEYS.read_text().splitlines()
    assert "4707fb02c91c545bc7343ce26dba4c32919f9a3e" in "".join(lines[:4])
    keys = [line for line in lines if line and not line.startswith("#")]
    assert len(keys) == 110 and len(set(keys)) == 110
    verdicts = _go_table()
    missing = [k for k in keys if k not in verdicts]
    assert not missing, f"docs/operations.md has no row for {missing}"
    odd = {k: verdicts[k] for k in keys if verdicts[k] not in ("same", "mapped", "refused")}
    assert not odd, odd


def test_a_typical_go_hami_values_file_renders_what_it_asks_for() -> None:
    release, namespace, args = GOHAMI_STYLE
    docs = render(*args, release=release, namespace=namespace)
    objs = by_key(docs)
    hami_cfg, sched = configs(docs, release)
    assert sched["profiles"][0]["schedulerName"] == "vgpu-scheduler"
    assert (hami_cfg.scheduler.node_policy, hami_cfg.scheduler.device_policy) == (
        "spread",
        "binpack",
    )
    backend = hami_cfg.backends["nvidia"]
    assert (backend.split_count, backend.memory_scaling) == (5, 2)
    nvidia = registry.create("nvidia", backend.settings("nvidia"))
    assert nvidia.resources.all() == [
        "nvidia.com/vgpu",
        "nvidia.com/vgpu-memory",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/vgpu-cores",
    ]
    assert hami_cfg.log.level == "debug"  # Go's extender flag --debug
    assert hami_cfg.node.numa_topology is True
    assert hami_cfg.scheduler.webhook.runtime_class_name == "nvidia"
    assert (hami_cfg.scheduler.http.address, hami_cfg.scheduler.http.port) == ("0.0.0.0", 9500)
    deployment = objs[("Deployment", "vgpu-hami-scheduler")]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["metadata"]["annotations"] == {"team": "gpu-platform"}
    spec = deployment["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    kube_scheduler = container(spec, "kube-scheduler")
    # Go HAMi <= 2.6's imageTag; its own --config is the chart's; its -v=4 replaces --v=2
    assert kube_scheduler["image"] == "mirror.example.com/kube-scheduler:v1.34.2"
    assert kube_scheduler["command"] == [
        "kube-scheduler",
        "--config=/etc/kube-scheduler/kube-scheduler.yaml",
        "--v=4",
    ]
    hami = container(spec, "hami")
    # global.imageTag is Go HAMi's version: never this project's tag
    assert hami["image"] == "mirror.example.com/hami-py/hami:0.1.0"
    assert {"name": "http", "containerPort": 9500} in hami["ports"]
    service = objs[("Service", "vgpu-hami-scheduler")]["spec"]
    assert service["type"] == "NodePort"
    ports = {p["name"]: (p["port"], p["nodePort"]) for p in service["ports"]}
    assert ports == {"http": (31993, 31993), "webhook": (443, 31998)}
    node = pod_spec(docs, "DaemonSet", "vgpu-hami-node")
    assert node["runtimeClassName"] == "nvidia"
    assert node["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert container(node, "install-hami-core")["image"] == (
        "mirror.example.com/projecthami/hami:v2.10.0"  # HAMi-core from Go HAMi's own image
    )
    assert container(node, "hami")["image"] == "mirror.example.com/hami-py/hami:0.1.0"
    assert objs[("RuntimeClass", "nvidia")]["handler"] == "nvidia"
    webhook = objs[("MutatingWebhookConfiguration", "vgpu-hami-webhook")]["webhooks"][0]
    assert {"key": "gpu.example.com/skip", "operator": "DoesNotExist"} in webhook["objectSelector"][
        "matchExpressions"
    ]
    assert webhook["clientConfig"]["service"]["port"] == 443


def test_defaults_keep_numa_topology_and_runtime_class_off() -> None:
    hami_cfg, _ = configs(render())
    assert hami_cfg.node.numa_topology is False
    assert hami_cfg.scheduler.webhook.runtime_class_name == ""
    assert hami_cfg.backends["nvidia"].register_format == "seed"
    assert hami_cfg.log.level == "info"
    hami_cfg, _ = configs(render("--set", "devicePlugin.registerFormat=json"))
    assert hami_cfg.backends["nvidia"].register_format == "json"
    docs = render(
        "--set", "scheduler.patch.enabled=false", "--set", "scheduler.livenessProbe=false"
    )
    hami_cfg, _ = configs(docs)
    assert hami_cfg.scheduler.webhook.tls_mode == "files"  # your Secret, Go's patch off
    spec = pod_spec(docs, "Deployment", "hami-scheduler")
    assert {"name": "tls", "secret": {"secretName": "hami-scheduler-tls"}} in spec["volumes"]
    assert not [c for c in spec["containers"] if "livenessProbe" in c]


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("devicePlugin.migStrategy=mixed", ["devicePlugin.migStrategy", "MIG"]),
        ("devices.ascend.enabled=true", ["devices.ascend.enabled", "no backend"]),
        ("dcuResourceName=hygon.com/x", ["dcuResourceName", "no backend"]),
        ("scheduler.kubeScheduler.extraNewArgs={--config=/x.yaml}", ["--config=/x.yaml"]),
        ("scheduler.extender.extraArgs={--gpu-scheduler-policy=spread}", ["extraArgs", "config"]),
        ("scheduler.service.monitorTargetPort=9000", ["monitorTargetPort", "metricsBindAddress"]),
        ("scheduler.extender.image.repository=projecthami/hami", ["Go HAMi's image"]),
        ("devicePlugin.nvidiaDriverRoot=/run/nvidia/driver", ["nvidiaDriverRoot"]),
        ("scheduler.forceOverwriteDefaultScheduler=false", ["forceOverwriteDefaultScheduler"]),
        ("global.gpuHookPath=/opt", ["gpuHookPath", "/usr/local/vgpu"]),
    ],
)
def test_go_values_hami_cannot_honour_fail_with_the_reason(setting: str, words: list[str]) -> None:
    result = helm("template", "hami", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, result.stdout
    for word in words:
        assert word in result.stderr, result.stderr


DRA = ("--set", "devicePlugin.mode=dra")
DRA_RULES = {
    "resourceslices": ["create", "delete", "get", "update"],
    "deviceclasses": ["create"],
    "resourceclaims": ["get"],
}


def _node_rules(docs: Docs, release: str = "hami") -> dict[str, list[str]]:
    """resource.k8s.io rules of the node agent's ClusterRole: resource -> sorted verbs."""
    role = by_key(docs)[("ClusterRole", f"{fullname(release)}-node")]
    return {
        resource: sorted(rule["verbs"])
        for rule in role["rules"]
        if "resource.k8s.io" in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_dra_mode_renders_backends_rbac_mounts_and_no_extender() -> None:
    docs = render(*DRA)
    objs = by_key(docs)
    hami_cfg, sched = configs(docs)
    # every backend the chart configures (fake is a test backend, off)
    assert {hami_cfg.backends[b].mode for b in ("nvidia", "mlu")} == {"dra"}
    # the plugin paths are hami's defaults, so the mounts below are where the agent looks
    assert hami_cfg.node.dra == config.DRANodeConfig()
    # kube-scheduler allocates the claims itself: an extender would only refuse the nodes
    assert "extenders" not in sched
    assert sched["profiles"][0]["schedulerName"] == hami_cfg.scheduler.scheduler_name
    assert _node_rules(docs) == DRA_RULES
    node = pod_spec(docs, "DaemonSet", "hami-node")
    host = {v["name"]: v["hostPath"]["path"] for v in node["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in container(node, "hami")["volumeMounts"]}
    dra = hami_cfg.node.dra
    for volume, path in (
        ("dra-plugins", dra.plugins_dir),
        ("dra-registry", dra.registry_dir),
        ("cdi", dra.cdi_dir),
    ):
        assert host[volume] == mounts[volume] == path
    policy = objs[("ValidatingAdmissionPolicy", "hami-node-slices")]
    (condition,) = policy["spec"]["matchConditions"]
    assert "system:serviceaccount:hami-system:hami-node" in condition["expression"]
    assert objs[("ValidatingAdmissionPolicyBinding", "hami-node-slices")]["spec"] == {
        "policyName": "hami-node-slices",
        "validationActions": ["Deny"],
    }
    # the extender mode's node scope policy is still there (the agent annotates nothing
    # in DRA mode, but pods of extender-mode releases may share the cluster)
    assert ("ValidatingAdmissionPolicy", "hami-node-scope") in objs


def test_dra_score_renders_a_prioritize_only_extender_and_its_watch_rights() -> None:
    docs = render(*DRA, "--set", "scheduler.draScore.enabled=true")
    hami_cfg, sched = configs(docs)
    assert hami_cfg.scheduler.dra_score is True
    (extender,) = sched["extenders"]
    assert extender == {
        "urlPrefix": f"http://127.0.0.1:{hami_cfg.scheduler.extender.port}",
        "prioritizeVerb": "prioritize",
        "weight": 5,
        "nodeCacheCapable": True,
        "ignorable": True,
        "httpTimeout": "5s",
        "enableHTTPS": False,
    }
    role = by_key(docs)[("ClusterRole", "hami-scheduler")]
    assert resource_rights(role) == {
        "resourceslices": ["list", "watch"],
        "resourceclaims": ["list", "watch"],
        # the webhook's: a DRA-mode device pod's template (docs/dra.md "Unchanged HAMi pods")
        "resourceclaimtemplates": ["create", "list", "watch"],
    }
    # off by default: the DRA rendering keeps kube-scheduler alone and the role with only
    # the webhook's rights (create a pod's template, read the device sizes)
    hami_cfg, sched = configs(render(*DRA))
    assert not hami_cfg.scheduler.dra_score and "extenders" not in sched
    assert hami_cfg.scheduler.webhook.device_mode == "dra"  # devicePlugin.mode's
    plain = by_key(render(*DRA))[("ClusterRole", "hami-scheduler")]
    assert resource_rights(plain) == {
        "resourceclaimtemplates": ["create"],
        "resourceslices": ["list"],
    }
    hami_cfg, _ = configs(render())
    assert hami_cfg.scheduler.webhook.device_mode == "extender"
    hami_cfg, _ = configs(render("--set", "scheduler.admissionWebhook.deviceMode=dra"))
    assert hami_cfg.scheduler.webhook.device_mode == "dra"


def resource_rights(role: dict[str, Any]) -> dict[str, list[str]]:
    """resource.k8s.io resource -> the verbs all of the role's rules give on it."""
    out: dict[str, set[str]] = {}
    for rule in role["rules"]:
        if "resource.k8s.io" in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault(resource, set()).update(rule["verbs"])
    return {resource: sorted(verbs) for resource, verbs in out.items()}


def test_dra_mode_paths_follow_the_config_value() -> None:
    docs = render(*DRA, "--set", "config.node.dra.cdi_dir=/etc/cdi")
    hami_cfg, _ = configs(docs)
    assert hami_cfg.node.dra.cdi_dir == "/etc/cdi"
    node = pod_spec(docs, "DaemonSet", "hami-node")
    assert {"name": "cdi", "hostPath": {"path": "/etc/cdi", "type": "DirectoryOrCreate"}} in node[
        "volumes"
    ]


def test_extender_mode_has_no_dra_rights_mounts_or_policy() -> None:
    docs = render()
    hami_cfg, sched = configs(docs)
    assert {hami_cfg.backends[b].mode for b in ("nvidia", "mlu")} == {"extender"}
    assert sched["extenders"]
    assert _node_rules(docs) == {}
    node = pod_spec(docs, "DaemonSet", "hami-node")
    assert not {"dra-plugins", "dra-registry", "cdi"} & {v["name"] for v in node["volumes"]}
    assert not [d for d in docs if d["metadata"]["name"] == "hami-node-slices"]


# --------------------------------------------------------------------------- API server


# Stand-ins for the CRDs of the Prometheus Operator and cert-manager, so their objects
# reach the API server too (their own schemas are not checked: they are not ours).
def _crd(group: str, kind: str) -> dict[str, Any]:
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


CRDS = [
    _crd("monitoring.coreos.com", "ServiceMonitor"),
    _crd("cert-manager.io", "Certificate"),
    _crd("cert-manager.io", "Issuer"),
]
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


async def _ensure(kube: Kube, path: str, body: dict[str, Any]) -> None:
    with contextlib.suppress(Conflict):  # already there from an earlier test
        await kube.request("POST", path, body=body)


async def _wait_established(kube: Kube, name: str) -> None:
    async with asyncio.timeout(30):
        while True:
            crd = await kube.request("GET", f"{CRD_PATH}/{name}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return
            await asyncio.sleep(0.2)


async def _dry_run_all(kube: Kube, docs: Docs) -> None:
    for doc in docs:
        # discovery of a new CRD's group can lag its Established condition: retry a 404
        async with asyncio.timeout(20):
            while True:
                try:
                    created = await apply(kube, doc, dry_run=True)
                    break
                except NotFound:
                    if doc["kind"] not in {c["spec"]["names"]["kind"] for c in CRDS}:
                        raise  # only the stand-in CRDs' kinds can be new
                    await asyncio.sleep(0.3)
        assert created["kind"] == doc["kind"], created
        assert created["metadata"]["name"] == doc["metadata"]["name"]


@pytest.mark.parametrize(
    ("release", "namespace", "args"),
    [
        DEFAULTS,
        HAMI_STYLE,
        ("hami", "hami-certs", ("--set", "scheduler.certManager.enabled=true")),
        ("hami-dra", "hami-dra", DRA),
        ("hami-score", "hami-score", (*DRA, "--set", "scheduler.draScore.enabled=true")),
        ("vgpu", "gohami-style", GOHAMI_STYLE[2]),
    ],
    ids=["defaults", "hami-values", "cert-manager", "dra", "dra-score", "gohami-values"],
)
async def test_every_rendered_object_passes_server_side_dry_run(
    kube: Kube, release: str, namespace: str, args: tuple[str, ...]
) -> None:
    docs = render(*args, "--set", "createNamespace=true", release=release, namespace=namespace)
    kinds = {doc["kind"] for doc in docs}
    assert {"Deployment", "DaemonSet", "ConfigMap", "ClusterRole", "Role", "Service"} <= kinds
    assert {"MutatingWebhookConfiguration", "ValidatingAdmissionPolicy"} <= kinds
    # Namespaced objects need their namespace to exist even in a dry run.
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    await apply(kube, ns)
    for crd in CRDS:
        await _ensure(kube, CRD_PATH, crd)
    for crd in CRDS:
        await _wait_established(kube, crd["metadata"]["name"])
    await _dry_run_all(kube, [d for d in docs if d["kind"] != "Namespace"])


def _slice(name: str, node: str, driver: str = "nvidia.hami.io") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


SLICES = "/apis/resource.k8s.io/v1/resourceslices"
JSON_BODY = "application/json"


async def test_dra_node_agent_rbac_and_policy_let_it_write_only_its_nodes_slices(
    controlplane: Any, kube: Kube, namespace: str
) -> None:
    """The DRA rendering's RBAC and hami-node-slices, applied for real: the node agent's
    service account (impersonated with its node-name claim) does every request the DRA
    publisher and plugin make, and nothing on another node's slice or outside hami's
    drivers."""
    suffix = os.urandom(3).hex()
    release, node, other = f"hami-{suffix}", f"dra-a-{suffix}", f"dra-b-{suffix}"
    docs = render(*DRA, release=release, namespace=namespace)
    wanted = {
        ("ServiceAccount", f"{release}-node"),
        ("ClusterRole", f"{release}-node"),
        ("ClusterRoleBinding", f"{release}-node"),
        ("ValidatingAdmissionPolicy", f"{release}-node-slices"),
        ("ValidatingAdmissionPolicyBinding", f"{release}-node-slices"),
    }
    objs = [d for d in docs if (d["kind"], d["metadata"]["name"]) in wanted]
    assert len(objs) == len(wanted)
    user = f"system:serviceaccount:{namespace}:{release}-node"
    theirs = _slice(f"{other}-nvidia-hami-io", other)
    await kube.request("POST", SLICES, body=theirs)  # another node's agent wrote it
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "nvidia.hami.io"}}]
            }
        },
    }
    await kube.request("POST", claims, body=claim)
    mine = _slice(f"{node}-nvidia-hami-io", node)
    mine_path = f"{SLICES}/{mine['metadata']['name']}"
    try:
        for doc in objs:
            await apply(kube, doc)
        async with aiohttp.ClientSession() as session:
            agent = As(controlplane, session, user, node)
            agent.headers = [h for h in agent.headers if "hami-system" not in h[1]] + [
                ("Impersonate-Group", f"system:serviceaccounts:{namespace}")
            ]
            # the binding reaches the admission plugin through an informer: wait until
            # it bites (RBAC may lag too; a probe that gets through is deleted again)
            probe = _slice(f"{other}-probe-{suffix}", other)
            answer: tuple[int, str] = (0, "")
            try:
                async with asyncio.timeout(30):
                    while not (answer[0] == 403 and "-node-slices" in answer[1]):
                        answer = await agent.send("POST", SLICES, probe, JSON_BODY)
                        if answer[0] == 201:
                            await kube.request("DELETE", f"{SLICES}/{probe['metadata']['name']}")
                        await asyncio.sleep(0.2)
            except TimeoutError:
                pytest.fail(f"hami-node-slices never refused another node's slice: {answer}")
            # what the publisher does: GET (404 first), POST, PUT with a new generation,
            # DELETE when it stops; what the plugin does: GET the claim
            assert (await agent.send("GET", mine_path))[0] == 404
            allowed(await agent.send("POST", SLICES, mine, JSON_BODY))
            current = await kube.request("GET", mine_path)
            current["spec"]["pool"]["generation"] = 2
            allowed(await agent.send("PUT", mine_path, current, JSON_BODY))
            allowed(await agent.send("GET", f"{claims}/c"))
            device_class = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": f"t{suffix}.hami.io"},
            }
            classes = "/apis/resource.k8s.io/v1/deviceclasses"
            allowed(await agent.send("POST", classes, device_class, JSON_BODY))
            # another node's slice: not created, changed, taken over or deleted
            other_path = f"{SLICES}/{theirs['metadata']['name']}"
            denied(
                await agent.send("POST", SLICES, _slice("x", other), JSON_BODY),
                "-node-slices",
                other,
            )
            stolen = await kube.request("GET", other_path)
            stolen["spec"]["pool"]["generation"] = 2  # (nodeName itself is immutable)
            denied(await agent.send("PUT", other_path, stolen, JSON_BODY), "-node-slices", other)
            denied(await agent.send("DELETE", other_path), "-node-slices", other)
            # nor may its own slices name another pool
            pool = _slice(f"{node}-pool", node)
            pool["spec"]["pool"]["name"] = other
            denied(await agent.send("POST", SLICES, pool, JSON_BODY), "-node-slices")
            # only hami's drivers and DeviceClasses
            foreign = _slice(f"{node}-foreign", node, driver="gpu.example.com")
            denied(await agent.send("POST", SLICES, foreign, JSON_BODY), "*.hami.io")
            evil = {**device_class, "metadata": {"name": "gpu.example.com"}}
            denied(await agent.send("POST", classes, evil, JSON_BODY), "*.hami.io")
            # RBAC: no listing slices or claims, no changing classes or claims
            denied(await agent.send("GET", SLICES))
            denied(await agent.send("GET", claims))
            denied(await agent.send("DELETE", f"{classes}/t{suffix}.hami.io"))
            denied(await agent.send("DELETE", f"{claims}/c"))
            # a token without the node-name claim writes nothing
            legacy = As(controlplane, session, user, "")
            legacy.headers = [h for h in agent.headers if not h[0].startswith("Impersonate-Extra")]
            denied(await legacy.send("DELETE", mine_path), "bound service account")
            allowed(await agent.send("DELETE", mine_path))
    finally:
        for doc in objs:
            if doc["kind"] != "ServiceAccount":
                with contextlib.suppress(KubeError):
                    await kube.request("DELETE", object_path(doc))
        for path in (
            f"{SLICES}/{theirs['metadata']['name']}",
            mine_path,
            f"/apis/resource.k8s.io/v1/deviceclasses/t{suffix}.hami.io",
        ):
            with contextlib.suppress(KubeError):
                await kube.request("DELETE", path)


async def test_scheduler_rbac_covers_the_webhooks_dra_path(
    controlplane: Any, kube: Kube, namespace: str
) -> None:
    """The default rendering's scheduler role, applied for real: as its service account
    the webhook's DRA path does every request it makes (read a Namespace's labels, list
    hami's slices by driver, create a ResourceClaimTemplate) and no more on templates and
    claims (docs/dra.md "Unchanged HAMi pods")."""
    suffix = os.urandom(3).hex()
    release = f"hami-{suffix}"
    docs = render(release=release, namespace=namespace)
    wanted = {
        ("ServiceAccount", f"{release}-scheduler"),
        ("ClusterRole", f"{release}-scheduler"),
        ("ClusterRoleBinding", f"{release}-scheduler"),
    }
    objs = [d for d in docs if (d["kind"], d["metadata"]["name"]) in wanted]
    assert len(objs) == len(wanted)
    user = f"system:serviceaccount:{namespace}:{release}-scheduler"
    templates = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"hami-{suffix}"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "c", "exactly": {"deviceClassName": "nvidia.hami.io"}}]
                }
            }
        },
    }
    try:
        for doc in objs:
            await apply(kube, doc)
        async with aiohttp.ClientSession() as session:
            role = As(controlplane, session, user, "")
            role.headers = [h for h in role.headers if "hami-system" not in h[1]] + [
                ("Impersonate-Group", f"system:serviceaccounts:{namespace}")
            ]
            answer: tuple[int, str] = (0, "")
            async with asyncio.timeout(30):  # the binding reaches the authorizer shortly
                while answer[0] != 200:
                    answer = await role.send("GET", f"/api/v1/namespaces/{namespace}")
                    await asyncio.sleep(0.2)
            query = "?fieldSelector=spec.driver%3Dnvidia.hami.io&limit=500"
            allowed(await role.send("GET", f"{SLICES}{query}"))
            allowed(await role.send("POST", templates, template, JSON_BODY))
            # nothing more than the webhook needs on templates and claims
            denied(await role.send("DELETE", f"{templates}/hami-{suffix}"))
            denied(await role.send("GET", f"{templates}/hami-{suffix}"))
            claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
            denied(await role.send("POST", claims, {**template, "kind": "ResourceClaim"}))
            denied(await role.send("PATCH", f"/api/v1/namespaces/{namespace}", {"metadata": {}}))
    finally:
        for doc in objs:
            if doc["kind"] != "ServiceAccount":
                with contextlib.suppress(KubeError):
                    await kube.request("DELETE", object_path(doc))
        with contextlib.suppress(KubeError):
            await kube.request("DELETE", f"{templates}/hami-{suffix}")


async def test_extra_decision_writers_may_write_decisions_others_still_may_not(
    controlplane: Any, kube: Kube, namespace: str
) -> None:
    """admissionPolicy.extraDecisionWriters (a cluster moving from Go HAMi: its scheduler
    and device plugin keep writing decisions), applied for real: the named user writes a
    pod's bind-phase, a user not named is still refused by the decision policy."""
    suffix = os.urandom(3).hex()
    release = f"hami-{suffix}"
    go_plugin = f"system:serviceaccount:{namespace}:go-hami-device-plugin"
    stranger = f"system:serviceaccount:{namespace}:someone-else"
    docs = render(
        "--set", f"admissionPolicy.extraDecisionWriters={{{go_plugin}}}",
        release=release, namespace=namespace,
    )  # fmt: skip
    name = f"{release}-decision-annotations"
    objs = [d for d in docs if d["metadata"]["name"] == name]
    assert {d["kind"] for d in objs} == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for doc in objs:  # narrowed to this test's namespace (the policy concerns every user)
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            doc["spec"]["matchResources"] = {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            }
    # both users may patch pods as far as RBAC goes: only the policy tells them apart
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": f"patch-pods-{suffix}", "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"patch-pods-{suffix}", "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        },
        "subjects": [
            {"kind": "User", "name": go_plugin, "apiGroup": "rbac.authorization.k8s.io"},
            {"kind": "User", "name": stranger, "apiGroup": "rbac.authorization.k8s.io"},
        ],
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{suffix}"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)
    pod_path = f"/api/v1/namespaces/{namespace}/pods/p-{suffix}"
    try:
        for doc in (role, binding, *objs):
            await apply(kube, doc)
        async with aiohttp.ClientSession() as session:
            theirs = As(controlplane, session, go_plugin, "")
            other = As(controlplane, session, stranger, "")
            # the binding reaches the admission plugin through an informer: wait until it
            # bites on the stranger (RBAC may lag too)
            answer: tuple[int, str] = (0, "")
            try:
                async with asyncio.timeout(30):
                    attempt = 0
                    while not (answer[0] == 403 and name in answer[1]):
                        attempt += 1  # a new value each time: an unchanged one is no change
                        probe = {"hami.io/bind-phase": f"probe-{attempt}"}
                        answer = await other.annotate(pod_path, probe)
                        await asyncio.sleep(0.2)
            except TimeoutError:
                pytest.fail(f"{name} never refused a user it does not name: {answer}")
            allowed(await theirs.annotate(pod_path, {"hami.io/bind-phase": "success"}))
            denied(await other.annotate(pod_path, {"hami.io/bind-phase": "failed"}), name)
            stored = await kube.request("GET", pod_path)
            assert stored["metadata"]["annotations"]["hami.io/bind-phase"] == "success"
    finally:
        for doc in (*objs, binding, role):
            with contextlib.suppress(KubeError):
                await kube.request("DELETE", object_path(doc))
        with contextlib.suppress(KubeError):
            await kube.request("DELETE", pod_path)


def test_cluster_metrics_value_reaches_the_scheduler_config() -> None:
    hami_cfg, _ = configs(render())
    assert hami_cfg.scheduler.cluster_metrics == "hami,go,pods"
    hami_cfg, _ = configs(render("--set", "scheduler.clusterMetrics=go"))
    assert config.cluster_metric_groups(hami_cfg.scheduler.cluster_metrics) == {"go"}
    refused = helm(
        "template", "hami", str(CHART), "--set", "scheduler.clusterMetrics=gpus", check=False
    )
    assert refused.returncode != 0 and "clusterMetrics" in refused.stderr
