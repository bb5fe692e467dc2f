"""The Cambricon MLU backend, running a fake ``cnmon`` as a real subprocess.

The fake behaves like the real tool: ``cnmon info -j`` writes ``cnmon_info.json`` in its
working directory and prints a table; variants print the JSON, fail, hang or print junk.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest
from _cambricon_helpers import X4_0, X4_1, backend, fake_cnmon, request

from hami.backends import BackendError, BackendSettings, DeviceNode, registry
from hami.backends._nvml import sysfs_bus_id
from hami.backends.cambricon import CambriconBackend
from hami.protocol import ContainerDevice, encode_node_devices


async def test_two_mlu370_x4_from_the_json_file(tmp_path: Path) -> None:
    devices = await backend(fake_cnmon(tmp_path, "file")).enumerate()
    assert [(d.uuid, d.index, d.model, d.memory_mib, d.healthy) for d in devices] == [
        (X4_0, 0, "MLU-MLU370-X4", 23308, True),
        (X4_1, 1, "MLU-MLU370-X4", 23308, True),
    ]
    # The register value of protocol.md's example (there the cards were reported unhealthy).
    node = CambriconBackend().to_node_devices(devices)
    assert encode_node_devices(node) == (
        f"{X4_0},10,23308,0,MLU-MLU370-X4,0,true:{X4_1},10,23308,0,MLU-MLU370-X4,0,true:"
    )


async def test_mlu290_from_stdout_and_numa_from_sysfs(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    entry = sysfs / "bus/pci/devices" / sysfs_bus_id("0000:af:00.0")
    entry.mkdir(parents=True)
    (entry / "numa_node").write_text("1\n")
    cnmon = fake_cnmon(tmp_path, "stdout", "cnmon_mlu290.json")
    [device] = await backend(cnmon, sysfs_root=str(sysfs)).enumerate()
    assert (device.uuid, device.model, device.memory_mib, device.numa) == (
        "MLU-8a2fd4c1-1840-0000-0000-000000000000",
        "MLU-MLU290-M5",
        32768,
        1,
    )


async def test_working_directory_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    await backend(fake_cnmon(tmp_path, "file")).enumerate()
    assert list(scratch.iterdir()) == []


def test_words_and_entry_point() -> None:
    mlu = registry.create("mlu")
    assert isinstance(mlu, CambriconBackend)
    assert (mlu.type_word, mlu.vendor_word) == ("mlu", "MLU")
    assert mlu.register_key == "hami.io/node-mlu-register"
    assert mlu.allocated_key == "hami.io/cambricon-mlu-devices-allocated"
    assert mlu.to_allocate_key == "hami.io/cambricon-mlu-devices-to-allocate"
    assert mlu.resources.all() == [
        "cambricon.com/vmlu",
        "cambricon.com/mlu.smlu.vmemory",
        "cambricon.com/mlu.smlu.vcore",
    ]
    assert mlu.resources.memory_unit_mib == 256


async def test_missing_cnmon(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"not found: the node needs the Cambricon driver"):
        await backend(tmp_path / "no-such-cnmon").enumerate()


async def test_failing_cnmon_names_status_and_stderr_tail(tmp_path: Path) -> None:
    with pytest.raises(BackendError) as err:
        await backend(fake_cnmon(tmp_path, "fail")).enumerate()
    message = str(err.value)
    assert "exited with status 3" in message
    assert message.endswith("cndev: no MLU device found (driver not loaded)")
    assert len(message) < 700  # a tail, not the whole of stderr


async def test_hanging_cnmon_times_out(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"did not finish within 0.5 s"):
        await backend(fake_cnmon(tmp_path, "hang"), cnmon_timeout=0.5).enumerate()


async def test_timeout_kills_a_wrapper_and_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    wrapper = tmp_path / "cnmon-wrapper"
    wrapper.write_text(f"#!/bin/sh\nsleep 30 &\necho $! > {pid_file}\nwait\n")
    wrapper.chmod(0o755)
    # A surviving child would hold cnmon's pipes open and hang the call for 30 s.
    with pytest.raises(BackendError, match="did not finish"):
        async with asyncio.timeout(10):
            await backend(wrapper, cnmon_timeout=0.5).enumerate()
    await asyncio.sleep(0.1)
    assert not running(int(pid_file.read_text()))


def running(pid: int) -> bool:
    """Whether a process lives (a zombie, killed but not yet reaped, does not)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


async def test_cancelled_enumeration_leaves_no_cnmon(tmp_path: Path) -> None:
    pid_file = tmp_path / "cnmon.pid"
    slow = tmp_path / "cnmon-slow"
    slow.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 30\n")
    slow.chmod(0o755)
    task = asyncio.create_task(backend(slow).enumerate())
    async with asyncio.timeout(5):
        while not pid_file.exists() or not pid_file.read_text():  # noqa: ASYNC110 (another process)
            await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not running(int(pid_file.read_text()))


async def test_unparsable_output(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"cannot read .* starts with: Error: unknown option"):
        await backend(fake_cnmon(tmp_path, "junk")).enumerate()


@pytest.mark.parametrize(
    "raw",
    [
        '{"CnmonInfo": {"CardNum": 0}}',
        '{"Cards": []}',
        '{"CnmonInfo": [{"CardNum": 0, "ProductName": "MLU370-X4", "UUID": "x"}]}',
        '{"CnmonInfo": [{"CardNum": "zero", "ProductName": "MLU370-X4", "UUID": "x",'
        ' "PhysicalMemUsage": {"Total": 1}}]}',
        '{"CnmonInfo": [{"CardNum": 0, "ProductName": "", "UUID": "x",'
        ' "PhysicalMemUsage": {"Total": 1}}]}',
    ],
)
def test_malformed_json_is_a_backend_error(raw: str) -> None:
    with pytest.raises(BackendError, match="cannot read"):
        CambriconBackend()._parse(raw)


def test_numeric_strings_are_accepted() -> None:
    raw = (
        '{"CnmonInfo": [{"CardNum": "1", "ProductName": "MLU370-S4", "UUID": "abc",'
        ' "PhysicalMemUsage": {"Total": "23308", "Used": "0"}}]}'
    )
    [device] = CambriconBackend()._parse(raw)
    assert (device.index, device.memory_mib, device.numa) == (1, 23308, 0)


# Allocation


async def node_cards(tmp_path: Path) -> list[Any]:
    return await backend(fake_cnmon(tmp_path, "file")).enumerate()


async def test_allocate_whole_card(tmp_path: Path) -> None:
    cards = await node_cards(tmp_path)
    answer = CambriconBackend().allocate(request([ContainerDevice(X4_1, "MLU", 23308, 0)], cards))
    assert answer.envs == {
        "CAMBRICON_SPLIT_VISIBLE_DEVICES": "1",
        "CAMBRICON_SPLIT_MEMS": "23308",
    }
    assert list(answer.devices) == [
        DeviceNode("/dev/cambricon_dev1", "/dev/cambricon_dev1", "rw"),
        DeviceNode("/dev/cambricon_ctl", "/dev/cambricon_ctl", "rw"),
    ]
    assert not answer.mounts


async def test_allocate_memory_slices_with_ipcm_on_the_host(tmp_path: Path) -> None:
    cards = await node_cards(tmp_path)
    host = tmp_path / "host"
    (host / "dev").mkdir(parents=True)
    (host / "dev/cambricon_ipcm0").touch()  # only card 0 has an IPC node
    mlu = CambriconBackend(BackendSettings(options={"host_root": str(host)}))
    answer = mlu.allocate(
        request(
            [ContainerDevice(X4_0, "MLU", 4096, 0), ContainerDevice(X4_1, "MLU", 8192, 0)], cards
        )
    )
    assert answer.envs == {
        "CAMBRICON_SPLIT_ENABLE": "1",
        "CAMBRICON_SPLIT_VISIBLE_DEVICES": "0,1",
        "CAMBRICON_SPLIT_MEMS": "4096,8192",
    }
    assert [d.host_path for d in answer.devices] == [
        "/dev/cambricon_dev0",
        "/dev/cambricon_dev1",
        "/dev/cambricon_ctl",
        "/dev/cambricon_ipcm0",
    ]


async def test_allocate_paths_and_env_names_are_options(tmp_path: Path) -> None:
    cards = await node_cards(tmp_path)
    mlu = CambriconBackend(
        BackendSettings(
            options={
                "dev_path": "/dev/mlu{slot}",
                "ctl_path": "/dev/mluctl",
                "env_split_enable": "MLU_SPLIT",
                "env_visible_devices": "MLU_VISIBLE",
                "env_mems": "MLU_MEMS",
            }
        )
    )
    answer = mlu.allocate(request([ContainerDevice(X4_0, "MLU", 2560, 0)], cards))
    assert answer.envs == {"MLU_SPLIT": "1", "MLU_VISIBLE": "0", "MLU_MEMS": "2560"}
    assert [d.host_path for d in answer.devices] == ["/dev/mlu0", "/dev/mluctl"]


async def test_allocate_unknown_uuid_names_pod_and_uuid(tmp_path: Path) -> None:
    cards = await node_cards(tmp_path)
    with pytest.raises(BackendError, match=r"pod ml/infer-0 .* device MLU-gone is not on this"):
        CambriconBackend().allocate(request([ContainerDevice("MLU-gone", "MLU", 1024, 0)], cards))
    with pytest.raises(BackendError, match=r"ml/infer-0"):
        CambriconBackend().allocate(request([], cards))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"cnmon_path": "/usr/bin/cnmon"}, "cnmon_path"),
        ({"cnmon_timeout": 0}, "cnmon_timeout"),
        ({"cnmon_timeout": "10s"}, "cnmon_timeout"),
        ({"dev_path": "/dev/cambricon_dev"}, "dev_path"),
        ({"env_mems": ""}, "env_mems"),
    ],
)
def test_bad_options_name_the_key(options: dict[str, Any], named: str) -> None:
    with pytest.raises(BackendError, match=named):
        CambriconBackend(BackendSettings(options=options))
