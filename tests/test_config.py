"""Config loading: defaults, the shipped files, env overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami import config

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_match_protocol_periods() -> None:
    cfg = config.from_mapping({}, env={})
    assert cfg.node.register_period.seconds == 30
    assert cfg.scheduler.handshake_period.seconds == 15
    assert cfg.scheduler.handshake_timeout.seconds == 60
    assert cfg.scheduler.node_lock_timeout.seconds == 300
    assert list(cfg.enabled_backends()) == ["nvidia"]


def test_shipped_reference_config_equals_defaults() -> None:
    # config/hami.yaml documents every default; it must not drift from the code.
    shipped = config.load(ROOT / "config" / "hami.yaml", env={})
    defaults = config.from_mapping({}, env={})
    assert shipped.log == defaults.log
    assert shipped.node == defaults.node
    assert shipped.scheduler == defaults.scheduler
    assert shipped.backends["nvidia"].split_count == defaults.backends["nvidia"].split_count
    settings = shipped.backends["nvidia"].settings("nvidia")
    assert settings.resources is not None and settings.resources.count == "nvidia.com/gpu"


def test_examples_load() -> None:
    for path in (ROOT / "config" / "examples").glob("*.yaml"):
        config.load(path, env={})


def test_env_overrides() -> None:
    cfg = config.from_mapping(
        {}, env={"NODE_NAME": "gpu-7", "HAMI_LOG_LEVEL": "debug", "HAMI_KUBECONFIG": "/k"}
    )
    assert (cfg.node.name, cfg.log.level, cfg.kubeconfig) == ("gpu-7", "debug", "/k")


def test_durations_and_partial_sections() -> None:
    cfg = config.from_mapping(
        {"node": {"register_period": "250ms"}, "scheduler": {"http": {"address": "127.0.0.1"}}},
        env={},
    )
    assert cfg.node.register_period.seconds == pytest.approx(0.25)
    # A partial section keeps that section's own defaults (the scheduler's port, not 9394).
    assert (cfg.scheduler.http.address, cfg.scheduler.http.port) == ("127.0.0.1", 9395)


def test_backend_sections_split_common_keys_from_options() -> None:
    cfg = config.from_mapping(
        {"backends": {"fake": {"enabled": True, "split_count": 4, "devices": [], "x": 1}}}, env={}
    )
    fake = cfg.backends["fake"]
    assert fake.split_count == 4
    assert fake.options == {"devices": [], "x": 1}
    assert cfg.backends["nvidia"].enabled  # untouched defaults stay


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"node": {"register_period": "soon"}}, "node.register_period: expected a duration"),
        ({"nodes": {}}, "config key nodes: unknown key"),
        ({"node": {"http": {"port": "x"}}}, "node.http.port: expected an integer"),
        ({"scheduler": {"node_policy": "random"}}, "scheduler.node_policy: expected one of"),
        ({"backends": {"nvidia": {"split_count": 0}}}, "backends.nvidia.split_count"),
        ({"backends": {"nvidia": {"memory_scaling": -1}}}, "backends.nvidia.memory_scaling"),
        ({"backends": ["nvidia"]}, "config key backends: expected a mapping"),
        ({"log": {"level": "loud"}}, "log.level: expected one of"),
        ([1, 2], "top level must be a mapping"),
    ],
)
def test_errors_name_the_key(raw: object, message: str) -> None:
    with pytest.raises(config.ConfigError, match=message.replace(".", r"\.")):
        config.from_mapping(raw, env={})


def test_bad_resources_override() -> None:
    cfg = config.from_mapping({"backends": {"nvidia": {"resources": {"gpu": "x"}}}}, env={})
    with pytest.raises(config.ConfigError, match=r"backends\.nvidia\.resources"):
        cfg.backends["nvidia"].settings("nvidia")


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="cannot read config file"):
        config.load(tmp_path / "missing.yaml", env={})
    broken = tmp_path / "broken.yaml"
    broken.write_text("node: [unclosed\n")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        config.load(broken, env={})


def test_reference_config_backend_sections_are_accepted_by_their_backends() -> None:
    # Option names in config/hami.yaml must be the ones the backends read.
    from hami.backends import registry

    shipped = config.load(ROOT / "config" / "hami.yaml", env={})
    for name, section in shipped.backends.items():
        backend = registry.create(name, section.settings(name))
        assert backend.settings.split_count == section.split_count


def test_scheduler_cluster_metrics_names_its_groups() -> None:
    cfg = config.from_mapping({"scheduler": {"cluster_metrics": "go, pods"}}, env={})
    assert config.cluster_metric_groups(cfg.scheduler.cluster_metrics) == {"go", "pods"}
    assert config.cluster_metric_groups("none") == frozenset()
    with pytest.raises(config.ConfigError, match=r"scheduler\.cluster_metrics.*hami, go, pods"):
        config.from_mapping({"scheduler": {"cluster_metrics": "hami,gpus"}}, env={})
