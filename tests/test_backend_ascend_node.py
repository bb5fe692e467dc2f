"""The Ascend backends' node side over a stand-in ``npu-smi`` run as a real subprocess
(tests/_ascend_helpers: the documented outputs with this node's values)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from _ascend_helpers import FakeChip, b3_node, fake_npu_smi, request

from hami.backends import BackendError, BackendSettings
from hami.backends.ascend import BACKENDS, AscendBackend
from hami.backends.ascend_chips import CHIPS
from hami.backends.ascend_rules import runtime_info
from hami.protocol import ContainerDevice, decode_node_devices
from hami.testkit.ascend_node import ascend_register


def backend(word: str, npu_smi: Path, dev: Path, **options: Any) -> AscendBackend:
    return BACKENDS[word](
        BackendSettings(options={"npu_smi": str(npu_smi), "dev_dir": str(dev), **options})
    )


async def test_eight_910b3_chips_register_as_the_ascend_device_plugin(tmp_path: Path) -> None:
    chips = b3_node(8, unhealthy=(6,))
    b3 = backend("Ascend910B3", *fake_npu_smi(tmp_path, chips))
    devices = await b3.enumerate()
    assert [(d.uuid, d.index, d.model, d.memory_mib) for d in devices] == [
        (c.uuid, i, "Ascend910B3", 65536) for i, c in enumerate(chips)
    ]
    assert [d.healthy for d in devices] == [i != 6 for i in range(8)]
    assert devices[0].uuid == "110A88C4-00A1A200-00000000-00000000-00180000"
    node = b3.to_node_devices(devices)
    register = b3.register_value(node)
    # Byte for byte the plug-in's value (hami.testkit.ascend_node writes it from its code)
    # where the chips are healthy; the unhealthy one has Go's omitted health.
    expected = json.loads(ascend_register("Ascend910B3", [c.uuid for c in chips], 65536, 20, 4))
    del expected[6]["health"]
    assert json.loads(register) == expected
    assert [d.healthy for d in decode_node_devices(register)] == [i != 6 for i in range(8)]
    assert b3.settings.split_count == CHIPS["Ascend910B3"].slots == 4  # kubelet's vNPUs
    assert b3.node_annotations(devices) == {"hami-vnpu-core": "false"}
    annotations = b3.registration(node, datetime(2026, 1, 1, tzinfo=UTC))
    assert set(annotations) == {
        "hami.io/node-register-Ascend910B3",
        "hami.io/node-handshake-Ascend910B3",
    }


async def test_a_vnpu_gets_its_physical_chip_and_template(tmp_path: Path) -> None:
    chips = b3_node(8)
    b3 = backend("Ascend910B3", *fake_npu_smi(tmp_path, chips))
    devices = await b3.enumerate()
    chip = CHIPS["Ascend910B3"]
    vnpu = [ContainerDevice(chips[1].uuid, "Ascend910B3", 16384, 0)]
    annotations = runtime_info(chip, [vnpu], {})  # what the scheduler writes with it
    answer = b3.allocate(request(vnpu, annotations, devices))
    # chip of logic id 1 is /dev/davinci6 here: the runtime reads physical ids
    assert dict(answer.envs) == {"ASCEND_VISIBLE_DEVICES": "6", "ASCEND_VNPU_SPECS": "vir05_1c_16g"}
    assert not answer.mounts and not answer.devices  # the runtime mounts the chips itself

    whole = [ContainerDevice(chips[i].uuid, "Ascend910B3", 65536, 0) for i in (0, 3)]
    answer = b3.allocate(request(whole, runtime_info(chip, [whole], {}), devices))
    assert dict(answer.envs) == {"ASCEND_VISIBLE_DEVICES": "7,4"}


async def test_a_910c_registers_network_zero_and_allocates_a_module(tmp_path: Path) -> None:
    chips = [
        FakeChip(
            npu=n,
            chip=c,
            logic=2 * n + c,
            phy=2 * n + c,
            name="Ascend910",
            die=f"V1,2A0B0C{2 * n + c:02X} 00000001 00000002 00000003 00000004",
        )
        for n in range(4)
        for c in range(2)
    ]
    c910 = backend("Ascend910C", *fake_npu_smi(tmp_path, chips))
    devices = await c910.enumerate()
    entries = json.loads(c910.register_value(c910.to_node_devices(devices)))
    assert [e["custominfo"] for e in entries] == [{"NetworkID": 0}] * 8
    module = [ContainerDevice(chips[i].uuid, "Ascend910C", 65536, 0) for i in (2, 3)]
    annotations = runtime_info(CHIPS["Ascend910C"], [module], {})
    answer = c910.allocate(request(module, annotations, devices))
    assert dict(answer.envs) == {"ASCEND_VISIBLE_DEVICES": "2,3"}


async def test_chips_of_another_type_name_the_backend_to_enable(tmp_path: Path) -> None:
    b4 = backend("Ascend910B4", *fake_npu_smi(tmp_path, b3_node(2)))
    with pytest.raises(
        BackendError, match=r"chips named 910B3, none named '910B4'.*enable Ascend910B3"
    ):
        await b4.enumerate()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("fail", "exited with status 3: dcmi module initialize failed"),
        ("empty", "cannot read 'npu-smi info -m' output .no header line.*starts with: .empty."),
        ("hang", "did not finish within 0.5 s"),
    ],
)
async def test_npu_smi_failures_are_clear_errors(tmp_path: Path, mode: str, message: str) -> None:
    b3 = backend("Ascend910B3", *fake_npu_smi(tmp_path, b3_node(1), mode), npu_smi_timeout=0.5)
    with pytest.raises(BackendError, match=message):
        await b3.enumerate()


async def test_malformed_answers_name_the_query_and_the_chip(tmp_path: Path) -> None:
    chips = b3_node(2)
    bad_die = {"info -t board -i 1 -c 0": "        Die ID                         : NA\n"}
    b3 = backend("Ascend910B3", *fake_npu_smi(tmp_path, chips, answers_override=bad_die))
    with pytest.raises(BackendError, match="NPU 1 chip 0: Die ID must be a tag and 5 hex words"):
        await b3.enumerate()
    junk = {"info -t health -i 0 -c 0": "Usage: npu-smi info\n"}
    b3 = backend("Ascend910B3", *fake_npu_smi(tmp_path, chips, answers_override=junk))
    with pytest.raises(BackendError, match="NPU 0 chip 0: no 'Health Status' line"):
        await b3.enumerate()


async def test_two_chips_with_one_die_id_are_refused(tmp_path: Path) -> None:
    first, second = b3_node(2)
    twin = FakeChip(second.npu, second.chip, second.logic, second.phy, "910B3", first.die)
    b3 = backend("Ascend910B3", *fake_npu_smi(tmp_path, [first, twin]))
    with pytest.raises(BackendError, match=f"several chips the Die ID {first.uuid}"):
        await b3.enumerate()


async def test_a_chip_without_its_davinci_device_is_refused(tmp_path: Path) -> None:
    script, dev = fake_npu_smi(tmp_path, b3_node(2))
    (dev / "davinci0").unlink()  # logic 1 is physical 0
    with pytest.raises(BackendError, match=r"NPU 1 chip 0 has no /dev/davinci<id>.*found: .1."):
        await backend("Ascend910B3", script, dev).enumerate()
    with pytest.raises(BackendError, match=r"cannot list .*nowhere.*'dev_dir'"):
        await backend("Ascend910B3", script, tmp_path / "nowhere").enumerate()
    with pytest.raises(BackendError, match=r"'/no/npu-smi' not found.*option 'npu_smi'"):
        await backend("Ascend910B3", Path("/no/npu-smi"), dev).enumerate()


async def test_untrusted_pod_values_are_refused_naming_pod_and_fix(tmp_path: Path) -> None:
    chips = b3_node(2)
    b3 = backend("Ascend910B3", *fake_npu_smi(tmp_path, chips))
    devices = await b3.enumerate()
    vnpu = [ContainerDevice(chips[0].uuid, "Ascend910B3", 16384, 0)]
    where = "pod ml/train-0 container main"
    cases: list[tuple[dict[str, str], str]] = [
        ({}, f"{where}: the pod has no huawei.com/Ascend910B3 annotation"),
        ({"huawei.com/Ascend910B3": "{"}, "is not JSON"),
        ({"huawei.com/Ascend910B3": '{"UUID": 1}'}, "must be a JSON list of objects"),
        (
            {"huawei.com/Ascend910B3": json.dumps([{"UUID": chips[0].uuid, "temp": "vir99"}])},
            "names vNPU template 'vir99', not one of Ascend910B3's",
        ),
        (
            {"huawei.com/vnpu-mode": "hami-core", "huawei.com/Ascend910B3": "null"},
            "soft split .* does not offer",
        ),
    ]
    for values, message in cases:
        with pytest.raises(BackendError, match=message):
            b3.allocate(request(vnpu, values, devices))
    stranger = [ContainerDevice("FFFFFFFF-0-0-0-0", "Ascend910B3", 16384, 0)]
    with pytest.raises(BackendError, match="FFFFFFFF-0-0-0-0 is not a Ascend910B3 of this node"):
        b3.allocate(request(stranger, {"huawei.com/Ascend910B3": "null"}, devices))


def test_settings_that_do_not_apply_are_refused() -> None:
    with pytest.raises(BackendError, match="memory_scaling and core_scaling do not apply"):
        BACKENDS["Ascend910B3"](BackendSettings(memory_scaling=2.0))
    with pytest.raises(BackendError, match=r"unknown option\(s\) \['npusmi'\]"):
        BACKENDS["Ascend910B3"](BackendSettings(options={"npusmi": "x"}))
    with pytest.raises(BackendError, match="'npu_smi_timeout' must be seconds > 0"):
        BACKENDS["Ascend910B3"](BackendSettings(options={"npu_smi_timeout": 0}))
