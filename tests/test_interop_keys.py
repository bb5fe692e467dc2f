"""Issue 10 items 1 and 2: the heartbeat under Go HAMi's key too, and the register form.

Go HAMi's NVIDIA plugin and scheduler (since v2.4) use ``hami.io/node-handshake``; NVIDIA
writes both keys and the scheduler reads both (protocol.md §1, §2). ``register_format:
json`` writes what Go HAMi >= 2.8 reads (byte-exact pins: tests/test_go_vectors.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami import cli, config
from hami.backends.base import BackendError, BackendSettings
from hami.backends.cambricon import CambriconBackend
from hami.backends.fake import FakeBackend
from hami.core.cluster import Cluster
from hami.core.requests import DeviceKind
from hami.protocol import decode_node_devices, handshake, keys

NOW = datetime(2024, 5, 20, 10, 0, 0, tzinfo=UTC)
OWN = "hami.io/node-handshake-nvidia"
GO_KEY = "hami.io/node-handshake"
REGISTER = "hami.io/node-nvidia-register"
DEVICES = [{"count": 2, "model": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "numa": 1}]


def fake(**settings: Any) -> FakeBackend:
    options = {"devices": DEVICES, "uuid_prefix": "GPU-k"}
    return FakeBackend(BackendSettings(options=options, **settings))


def cluster() -> Cluster:
    return Cluster([DeviceKind.from_backend(fake())])


def node(annotations: dict[str, str], **status: dict[str, str]) -> dict[str, Any]:
    meta = {"name": "n1", "resourceVersion": "7", "annotations": annotations}
    return {"metadata": meta, "status": status}


def seen(c: Cluster, annotations: dict[str, str], now: datetime = NOW) -> bool:
    c.upsert_node(node(annotations), now)
    return c.nodes["n1"].types["nvidia"].available


def register() -> str:
    return fake().register_value(fake().to_node_devices(fake()._devices))


# --------------------------------------------------------------------------- writer


def test_nvidia_heartbeat_goes_to_both_keys_others_to_their_own() -> None:
    backend = fake()
    written = backend.registration(backend.to_node_devices(backend._devices), NOW)
    assert written[OWN] == written[GO_KEY] == "Reported_2024-05-20 10:00:00"
    assert set(written) == {REGISTER, OWN, GO_KEY}
    mlu = CambriconBackend(BackendSettings(options={"cnmon": "/nonexistent"}))
    assert mlu.handshake_keys == ("hami.io/node-handshake-mlu",)
    assert set(mlu.registration([], NOW)) == {mlu.register_key, "hami.io/node-handshake-mlu"}


def test_register_format_json_writes_go_hamis_json() -> None:
    backend = fake(register_format="json")
    value = backend.register_value(backend.to_node_devices(backend._devices))
    assert value == (
        '[{"id":"GPU-k-0","count":10,"devmem":40960,"devcore":100,'
        '"type":"NVIDIA-A100-SXM4-40GB","numa":1,"mode":"hami-core","health":true},'
        '{"id":"GPU-k-1","index":1,"count":10,"devmem":40960,"devcore":100,'
        '"type":"NVIDIA-A100-SXM4-40GB","numa":1,"mode":"hami-core","health":true}]'
    )
    assert decode_node_devices(value) == backend.to_node_devices(backend._devices)
    assert fake().register_value(fake().to_node_devices(fake()._devices)).startswith("GPU-k-0,10,")


def test_register_format_is_checked_in_config_and_backend() -> None:
    cfg = config.from_mapping({"backends": {"fake": {"register_format": "json"}}}, env={})
    assert cfg.backends["fake"].settings("fake").register_format == "json"
    assert cfg.backends["fake"].options == {}
    assert config.Config().backends["nvidia"].register_format == "seed"
    with pytest.raises(
        config.ConfigError, match=r"backends\.nvidia\.register_format.*seed or json"
    ):
        config.from_mapping({"backends": {"nvidia": {"register_format": "yaml"}}}, env={})
    with pytest.raises(BackendError, match="register_format must be seed or json"):
        fake(register_format="xml")


def test_hami_devices_shows_the_configured_form(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = {"backends": {"fake": {"enabled": True, "register_format": "json", "devices": DEVICES}}}
    path = tmp_path / "hami.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli.main(["devices", "--backend", "fake", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(register_format: json)" in out
    lines = dict(
        line.strip().split(": ", 1) for line in out.splitlines() if line.startswith("  hami.io/")
    )
    assert lines[REGISTER].startswith('[{"id":"GPU-fake-')
    assert lines[OWN].startswith("Reported_") and lines[GO_KEY] == lines[OWN]


# --------------------------------------------------------------------------- scheduler


def test_a_node_heartbeating_only_under_go_hamis_key_stays_available() -> None:
    # A Go HAMi <= 2.7 plugin: Reported under hami.io/node-handshake, never -nvidia.
    c = cluster()
    assert seen(c, {REGISTER: register(), GO_KEY: "Reported_2024-05-20 09:59:59"})
    writes, _ = c.refresh(NOW)
    assert [dict(w.annotations) for w in writes] == [{GO_KEY: "Requesting_2024-05-20 10:00:00"}]
    # Reported again every 30 s: never times out (before the fix: "handshake timed out").
    for step in range(1, 8):
        now = NOW + timedelta(seconds=30 * step)
        assert seen(c, {REGISTER: register(), GO_KEY: handshake.reported(now)}, now)
        c.refresh(now)
        assert c.nodes["n1"].types["nvidia"].available


def test_the_go_key_alone_times_out_like_ours() -> None:
    c = cluster()
    seen(c, {REGISTER: register(), GO_KEY: "Reported_2024-05-20 09:59:59"})
    stamp = "Requesting_2024-05-20 10:00:00"
    assert seen(c, {REGISTER: register(), GO_KEY: stamp}, NOW + timedelta(seconds=60))
    assert not seen(c, {REGISTER: register(), GO_KEY: stamp}, NOW + timedelta(seconds=61))
    assert c.nodes["n1"].types["nvidia"].reason == handshake.HANDSHAKE_TIMED_OUT
    writes, _ = c.refresh(NOW + timedelta(seconds=61))
    assert writes == []  # a stale stamp is never refreshed


def test_a_type_is_available_when_any_of_its_keys_says_so() -> None:
    c = cluster()
    stale = "Requesting_2024-05-20 09:00:00"
    assert seen(c, {REGISTER: register(), OWN: stale, GO_KEY: "Reported_2024-05-20 09:59:59"})
    writes, _ = c.refresh(NOW)
    # Requesting_ goes to the key that asked for it; the stale one is left alone.
    assert [dict(w.annotations) for w in writes] == [{GO_KEY: "Requesting_2024-05-20 10:00:00"}]
    assert not seen(c, {REGISTER: register(), OWN: stale, GO_KEY: stale})


def test_both_keys_are_stamped_when_the_agent_wrote_both() -> None:
    c = cluster()
    beat = "Reported_2024-05-20 09:59:59"
    assert seen(c, {REGISTER: register(), OWN: beat, GO_KEY: beat})
    writes, _ = c.refresh(NOW)
    stamp = "Requesting_2024-05-20 10:00:00"
    assert [dict(w.annotations) for w in writes] == [{OWN: stamp, GO_KEY: stamp}]


def test_no_key_yet_stamps_every_key_of_the_type() -> None:
    c = cluster()
    assert seen(c, {REGISTER: register()})
    writes, _ = c.refresh(NOW)
    stamp = "Requesting_2024-05-20 10:00:00"
    assert [dict(w.annotations) for w in writes] == [{OWN: stamp, GO_KEY: stamp}]


def test_go_hamis_key_means_nothing_for_other_types() -> None:
    mlu = CambriconBackend(BackendSettings(options={"cnmon": "/nonexistent"}))
    c = Cluster([DeviceKind.from_backend(mlu)])
    value = "MLU-a,10,23308,0,MLU-MLU370-X4,0,true:"
    stale = "Requesting_2024-05-20 09:00:00"
    c.upsert_node(node({mlu.register_key: value, "hami.io/node-handshake-mlu": stale}), NOW)
    c.upsert_node(
        node(
            {
                mlu.register_key: value,
                "hami.io/node-handshake-mlu": stale,
                GO_KEY: "Reported_2024-05-20 09:59:59",
            }
        ),
        NOW,
    )
    assert not c.nodes["n1"].types["mlu"].available
    assert keys.handshake_keys("mlu") == ("hami.io/node-handshake-mlu",)


class _OwnKeys(FakeBackend):
    """A plugin backend that names its heartbeat keys itself."""

    @property
    def handshake_keys(self) -> tuple[str, ...]:
        return ("example.com/heartbeat", "hami.io/node-handshake-xpu")


def test_the_backend_supplies_its_heartbeat_keys_to_both_roles() -> None:
    backend = _OwnKeys(BackendSettings(options={"type": "xpu", "devices": DEVICES}))
    kind = DeviceKind.from_backend(backend)
    assert kind.heartbeat_keys() == ("example.com/heartbeat", "hami.io/node-handshake-xpu")
    assert DeviceKind.from_backend(fake()).heartbeat_keys() == (OWN, GO_KEY)
    written = backend.registration(backend.to_node_devices(backend._devices), NOW)
    assert written["example.com/heartbeat"].startswith("Reported_")
    c = Cluster([kind])
    value = written["hami.io/node-xpu-register"]
    c.upsert_node(node({"hami.io/node-xpu-register": value, "example.com/heartbeat": "x"}), NOW)
    assert c.nodes["n1"].types["xpu"].available
    writes, _ = c.refresh(NOW)
    assert [dict(w.annotations) for w in writes] == [
        {"example.com/heartbeat": "Requesting_2024-05-20 10:00:00"}
    ]
