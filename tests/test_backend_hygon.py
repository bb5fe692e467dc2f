"""Hygon DCU, scheduler side (issue 24): found through the entry points, its keys, words and
request rules as Go HAMi 2.10 has them, and a node of HAMi's dcu-vgpu-device-plugin read
and used by the scheduler."""

from __future__ import annotations

from typing import Any

import pytest
from _core_helpers import NOW, pod

from hami.backends import BackendError, registry
from hami.backends.hygon import HygonBackend
from hami.core.cluster import Cluster
from hami.core.requests import DeviceKind, parse_pod, parse_selectors
from hami.protocol import keys

REGISTER = "hami.io/node-dcu-register"
HANDSHAKE = "hami.io/node-handshake-dcu"
# As HAMi's dcu-vgpu-device-plugin registers two Z100L cards (the 7-field form).
VALUE = "DCU-0,30,32768,100,DCU-Z100L,0,true:DCU-1,30,32768,100,DCU-Z100L,1,true:"


def kind() -> DeviceKind:
    return DeviceKind.from_backend(registry.create("dcu"))


def dcu_pod(limits: dict[str, Any], annotations: dict[str, str] | None = None) -> Any:
    return pod({"name": "c", "resources": {"limits": limits}}, annotations=annotations)


def test_found_through_the_entry_points_with_gos_keys_and_words() -> None:
    backend = registry.create("dcu")
    assert isinstance(backend, HygonBackend)
    assert backend.register_key == REGISTER
    assert backend.handshake_keys == (HANDSHAKE,)
    k = kind()
    assert (k.vendor_word, k.allocated_key, k.to_allocate_key) == (
        "DCU",
        "hami.io/dcu-devices-allocated",
        "hami.io/dcu-devices-to-allocate",
    )
    assert k.managed_resources() == ["hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores"]
    assert k.annotation("use-type") == "hygon.com/use-dcutype"
    assert k.annotation("nouse-type") == "hygon.com/nouse-dcutype"
    assert k.annotation("use-uuid") == "hygon.com/use-gpuuuid"
    assert k.annotation("nouse-uuid") == "hygon.com/nouse-gpuuuid"
    selectors = parse_selectors({"hygon.com/use-gpuuuid": "DCU-1"}, k)
    assert selectors.use_uuids == frozenset({"DCU-1"})


def test_requests_as_go_derives_them() -> None:
    k = kind()
    request = parse_pod(dcu_pod({"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000}), [k])
    assert request is not None
    [[item]] = request.containers
    # MiB (Go's chart sets memoryFactor 1); absent cores: the whole device (Go's 100).
    assert (item.vendor, item.count, item.memory, item.memory_percentage, item.cores) == (
        "DCU",
        1,
        2000,
        None,
        100,
    )
    request = parse_pod(dcu_pod({"hygon.com/dcunum": 2, "hygon.com/dcucores": 30}), [k])
    assert request is not None
    [[item]] = request.containers
    assert (item.count, item.memory_percentage, item.cores) == (2, 100, 30)


def test_a_node_of_the_dcu_plugin_is_read_and_used() -> None:
    c = Cluster([kind()])
    node = {
        "metadata": {
            "name": "dcu1",
            "annotations": {REGISTER: VALUE, HANDSHAKE: "Reported_2024-05-20 09:59:59"},
        }
    }
    errors, changes = c.upsert_node(node, NOW)
    assert errors == [] and [ch.available for ch in changes] == [True]
    request = parse_pod(
        dcu_pod(
            {"hygon.com/dcunum": 1, "hygon.com/dcumem": 4096}, {"hygon.com/use-gpuuuid": "DCU-1"}
        ),
        list(c.kinds.values()),
    )
    assert request is not None
    decision = c.decide(request, ["dcu1"])
    assert decision.fit is not None
    [[device]] = decision.fit.assignment["dcu"]
    assert (device.uuid, device.vendor, device.memory, device.cores) == ("DCU-1", "DCU", 4096, 100)
    assert keys.node_register("dcu") == REGISTER


async def test_no_node_side_says_what_to_run_instead() -> None:
    backend = registry.create("dcu")
    with pytest.raises(BackendError, match="dcu-vgpu-device-plugin"):
        await backend.enumerate()
