"""scripts/gpu-check.sh (issue 13): its no-GPU path for real, its checks with a fake driver.

The fake NVML of test_backend_nvidia stands in for the driver (in the backend, and as
``pynvml`` for an in-process ``hami devices``); a fabricated ``nvidia-smi`` on PATH answers
from the same fixture. Everything else is the code a GPU machine runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes.util
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pynvml
import pytest
from _nvml_helpers import FakeGpu, FakeNvml, load_node

from hami import cli
from hami.backends.base import BackendSettings
from hami.protocol import NodeDevice
from hami.testkit import gpucheck, gpucheck_cuda
from hami.testkit.controlplane import ControlPlane
from hami.testkit.gpucheck import (
    Options,
    SmiGpu,
    Topology,
    compare_devices,
    parse_hami_devices,
    parse_smi_query,
    parse_topo,
)
from hami.testkit.gpucheck_run import Answer, Ran

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
FIXTURES = Path(__file__).parent / "fixtures"

# What nvidia-smi prints for the mixed fixture node (two V100s, a T4).
MIXED_QUERY = """uuid, name, memory.total [MiB]
GPU-8a3b2c1d-4e5f-6a7b-8c9d-0e1f2a3b4c5d, Tesla V100-PCIE-32GB, 32768 MiB
GPU-9b4c3d2e-5f60-7b8c-9d0e-1f2a3b4c5d6e, Tesla V100-PCIE-32GB, 32768 MiB
GPU-2c5d4e3f-6071-8c9d-0e1f-2a3b4c5d6e7f, Tesla T4, 15360 MiB
"""
MIXED_TOPO = (
    "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNODE\tSYS\t0-19\tN/A\t\tN/A\n"
    "GPU1\tNODE\t X \tSYS\t0-19\tN/A\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \t20-39\t1\t\tN/A\n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges\n"
)
# One H200, as the lent machine shows it (driver 580).
H200_QUERY = (
    "uuid, name, memory.total [MiB]\n"
    "GPU-3f1c9a7e-2b4d-4e8f-9a6c-1d2e3f4a5b6c, NVIDIA H200, 143771 MiB\n"
)
H200_TOPO = (
    "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
)


# --------------------------------------------------------------------------- the script


def _bin_dir(tmp_path: Path, nvidia_smi: str | None) -> str:
    """A PATH with only what the script needs, and the given nvidia-smi (None: none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "head"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    if nvidia_smi is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(nvidia_smi)
        smi.chmod(0o755)
    return str(bin_dir)


def _run_script(path: str) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash
    return subprocess.run(
        [bash, str(SCRIPT)],
        env={"PATH": path, "HOME": os.environ.get("HOME", "/tmp")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("nvidia_smi", "says"),
    [
        (None, "nvidia-smi not found"),
        (
            "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the "
            'NVIDIA driver." >&2\nexit 9\n',
            "couldn't communicate with the NVIDIA driver",
        ),
        ("#!/bin/sh\necho 'No devices were found'\nexit 6\n", "No devices were found"),
        ("#!/bin/sh\nexit 0\n", "lists no GPU"),
    ],
)
def test_no_gpu_one_line_and_exit_0(tmp_path: Path, nvidia_smi: str | None, says: str) -> None:
    done = _run_script(_bin_dir(tmp_path, nvidia_smi))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    assert lines[0].startswith("gpu-check: no NVIDIA GPU here (")
    assert says in lines[0]


LISTS_ONE = (
    "#!/bin/sh\n"
    'case "$*" in\n'
    "  *noheader*) echo GPU-3f1c9a7e ;;\n"
    '  *) printf "uuid, name, memory.total [MiB]\\nGPU-3f1c9a7e, NVIDIA H200, 143771 MiB\\n" ;;\n'
    "esac\n"
)


def test_gpu_listed_but_no_nvml_uses_the_venv_and_fails_in_one_line(tmp_path: Path) -> None:
    """.venv exists: no `make install` (make is not even on PATH); a GPU that nvidia-smi lists
    and NVML cannot open is a failure, not "no GPU"."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("needs the project's .venv (make install)")
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has an NVIDIA driver library")
    done = _run_script(_bin_dir(tmp_path, LISTS_ONE))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    assert lines[0].startswith("gpu-check: nvidia-smi lists 1 GPU(s) but NVML does not start: ")
    assert "libnvidia-ml.so.1 not found" in lines[0]
    assert "make" not in done.stderr


def test_no_gpu_in_python_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The module's own probe, for a caller that skips the shell script."""
    monkeypatch.setenv("PATH", _bin_dir(tmp_path, "#!/bin/sh\nexit 9\n"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert gpucheck.main([]) == 0
    assert out.getvalue().count("\n") == 1
    assert "no NVIDIA GPU here" in out.getvalue()


# --------------------------------------------------------------------------- parsers


def test_parse_smi_query() -> None:
    gpus = parse_smi_query(MIXED_QUERY)
    assert [(g.index, g.name, g.memory_mib, g.healthy) for g in gpus] == [
        (0, "Tesla V100-PCIE-32GB", 32768, True),
        (1, "Tesla V100-PCIE-32GB", 32768, True),
        (2, "Tesla T4", 15360, True),
    ]
    assert gpus[2].uuid == "GPU-2c5d4e3f-6071-8c9d-0e1f-2a3b4c5d6e7f"
    [h200] = parse_smi_query(H200_QUERY)
    assert (h200.name, h200.memory_mib) == ("NVIDIA H200", 143771)


def test_parse_smi_query_error_fields_and_bad_header() -> None:
    text = "uuid, name, memory.total [MiB]\nGPU-1, NVIDIA A100-SXM4-80GB, [GPU requires reset]\n"
    [gpu] = parse_smi_query(text)
    assert gpu.memory_mib is None
    assert not gpu.healthy
    assert gpu.problems == ("memory.total=[GPU requires reset]",)
    assert parse_smi_query("") == []
    with pytest.raises(ValueError, match="header"):
        parse_smi_query("index, uuid\n0, GPU-1\n")


def test_parse_topo() -> None:
    topo = parse_topo(MIXED_TOPO)
    assert topo.numa == {0: "N/A", 1: "N/A", 2: "1"}
    assert topo.links == {(0, 1): "NODE", (0, 2): "SYS", (1, 2): "SYS"}
    single = parse_topo(H200_TOPO)
    assert single == Topology({0: "0"}, {})
    with pytest.raises(ValueError):
        parse_topo("topology not supported on this system\n")
    # a Tesla P4 node as HAMi's issue #99 shows it; and NICs beside two GPUs
    p4 = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-7\t\tN/A\t\tN/A\n"
    assert parse_topo(p4).numa == {0: "N/A"}
    nics = (
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV12\tPXB\t48-63,176-191\t3\t\tN/A\n"
        "GPU1\tNV12\t X \tPXB\t48-63,176-191\t3\t\tN/A\n"
        "NIC0\tPXB\tPXB\t X \n"
    )
    assert parse_topo(nics) == Topology({0: "3", 1: "3"}, {(0, 1): "NV12"})
    # a row missing a cell is left unread, not misread
    short = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t\t1\t\tN/A\n"
    assert parse_topo(short).numa == {}
    assert gpucheck.expected_numa("N/A") == 0
    assert gpucheck.expected_numa("1") == 1
    assert gpucheck.expected_numa("0-1") is None
    assert gpucheck.expected_numa(None) is None


def _config(tmp_path: Path, **nvidia: Any) -> Path:
    path = tmp_path / "hami.yaml"
    section = {"sysfs_root": str(tmp_path / "sys"), **nvidia}
    path.write_text(json.dumps({"backends": {"nvidia": section}}))  # JSON is YAML
    return path


def in_process_hami_devices(nvml: Any) -> gpucheck.HamiDevices:
    """``hami devices --backend nvidia`` through hami.cli, the fake NVML as pynvml."""

    def run(extra: Sequence[str]) -> Ran:
        argv = ["devices", "--backend", "nvidia", *extra]
        out, err = io.StringIO(), io.StringIO()
        with (
            mock.patch.dict(sys.modules, {"pynvml": nvml}),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            code = cli.main(argv)
        return Ran(("hami", *argv), code, out.getvalue(), err.getvalue())

    return run


@pytest.fixture
def mixed(tmp_path: Path) -> FakeNvml:
    return FakeNvml(load_node("nvml_mixed_v100_t4.json", tmp_path / "sys"))


def test_parse_real_hami_devices_output(mixed: FakeNvml, tmp_path: Path) -> None:
    ran = in_process_hami_devices(mixed)(["--config", str(_config(tmp_path))])
    assert ran.ok, ran.stderr
    devices = parse_hami_devices(ran.stdout)
    assert [(d.index, d.uuid, d.model, d.memory, d.numa, d.healthy) for d in devices] == [
        (0, mixed.gpus[0].uuid, "NVIDIA-Tesla V100-PCIE-32GB", 32768, 0, True),
        (1, mixed.gpus[1].uuid, "NVIDIA-Tesla V100-PCIE-32GB", 32768, 0, True),
        (2, mixed.gpus[2].uuid, "NVIDIA-Tesla T4", 15360, 1, True),
    ]
    assert parse_hami_devices("backend nvidia (type nvidia): 0 device(s)\n") == []
    with pytest.raises(ValueError, match="backend"):
        parse_hami_devices("backend nvidia: NVML failed to start\n")


# --------------------------------------------------------------------------- step 1


def _hami(smi: Sequence[SmiGpu], **changes: Any) -> list[NodeDevice]:
    numa = {0: 0, 1: 0, 2: 1}
    devices = [
        NodeDevice(
            uuid=g.uuid,
            count=10,
            memory=g.memory_mib or 0,
            cores=100,
            model=f"NVIDIA-{g.name}",
            numa=numa[g.index],
            healthy=True,
            index=g.index,
        )
        for g in smi
    ]
    index = changes.pop("at", 0)
    if changes:
        from dataclasses import replace

        devices[index] = replace(devices[index], **changes)
    return devices


def test_compare_all_match() -> None:
    smi = parse_smi_query(MIXED_QUERY)
    checks = compare_devices(smi, _hami(smi), BackendSettings(), parse_topo(MIXED_TOPO))
    assert [c.status for c in checks] == ["PASS"] * 3
    assert checks[2].name == f"step1 GPU2 {smi[2].uuid}"
    assert "NVIDIA-Tesla T4, 15360 MiB, NUMA 1, healthy=true" in checks[2].detail


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"memory": 32000}, "memory MiB: nvidia-smi 32768, hami 32000"),
        ({"model": "NVIDIA-Tesla V100"}, "model: nvidia-smi 'NVIDIA-Tesla V100-PCIE-32GB'"),
        ({"numa": 1}, "NUMA: nvidia-smi 0, hami 1"),
        ({"healthy": False}, "healthy: nvidia-smi True, hami False"),
        ({"index": 2}, "index: nvidia-smi 0, hami 2"),
        ({"count": 5}, "split: nvidia-smi 10, hami 5"),
    ],
)
def test_compare_names_each_mismatch(change: dict[str, Any], said: str) -> None:
    smi = parse_smi_query(MIXED_QUERY)
    checks = compare_devices(smi, _hami(smi, **change), BackendSettings(), parse_topo(MIXED_TOPO))
    assert [c.status for c in checks] == ["FAIL", "PASS", "PASS"]
    assert said in checks[0].detail


def test_compare_missing_and_extra_devices() -> None:
    smi = parse_smi_query(MIXED_QUERY)
    hami = _hami(smi)
    extra = NodeDevice("GPU-ghost", 10, 1024, 100, "NVIDIA-X", 0, True, 3)
    checks = compare_devices(smi, [*hami[1:], extra], BackendSettings(), None)
    assert [c.status for c in checks] == ["FAIL", "PASS", "PASS", "FAIL"]
    assert "nvidia-smi lists it, hami devices does not" in checks[0].detail
    assert checks[3].name == "step1 GPU-ghost"
    assert "NUMA not checked" in checks[1].detail  # no topo -m: said, not hidden


def test_compare_applies_memory_and_core_scaling() -> None:
    smi = parse_smi_query(H200_QUERY)
    scaled = [
        NodeDevice(smi[0].uuid, 4, int(143771 * 1.5), 200, "NVIDIA H200", 0, True, 0),
    ]
    settings = BackendSettings(split_count=4, memory_scaling=1.5, core_scaling=2.0)
    [check] = compare_devices(smi, scaled, settings, parse_topo(H200_TOPO))
    assert check.status == "PASS", check.detail
    [check] = compare_devices(smi, scaled, BackendSettings(split_count=4), None)
    assert check.status == "FAIL"
    assert "memory MiB: nvidia-smi 143771, hami 215656" in check.detail


def test_step1_through_hami_devices(mixed: FakeNvml, tmp_path: Path) -> None:
    """hami devices (in-process CLI, fake driver) against fabricated nvidia-smi output:
    the fixture agrees with itself; a card nvidia-smi reports smaller is a FAIL."""
    config_path = str(_config(tmp_path))
    run = in_process_hami_devices(mixed)
    smi, topo = parse_smi_query(MIXED_QUERY), parse_topo(MIXED_TOPO)
    checks = gpucheck.step1(smi, topo, BackendSettings(), run, config_path)
    assert [c.status for c in checks] == ["PASS"] * 3, [c.line() for c in checks]
    smaller = parse_smi_query(MIXED_QUERY.replace("15360 MiB", "15109 MiB"))
    checks = gpucheck.step1(smaller, topo, BackendSettings(), run, config_path)
    assert [c.status for c in checks] == ["PASS", "PASS", "FAIL"]
    failing = gpucheck.step1(smi, topo, BackendSettings(), run, str(tmp_path / "missing.yaml"))
    assert [c.status for c in failing] == ["FAIL"]
    assert failing[0].name == "step1 hami devices"


# --------------------------------------------------------------------------- step 3


def _answer(tmp_path: Path) -> Answer:
    host = tmp_path / "containers" / "uid_c0"
    host.mkdir(parents=True)
    return Answer(
        uuid="GPU-3f1c9a7e",
        index=2,
        memory_mib=2048,
        cores=30,
        envs={
            "NVIDIA_VISIBLE_DEVICES": "GPU-3f1c9a7e",
            "CUDA_DEVICE_MEMORY_LIMIT_0": "2048m",
            "CUDA_DEVICE_SM_LIMIT": "30",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/abc.cache",
        },
        mounts={
            "/usr/local/vgpu/libvgpu.so": ("/usr/local/vgpu/libvgpu.so", True),
            "/usr/local/vgpu": (str(host), False),
            "/tmp/vgpulock": (str(tmp_path / "lock"), False),
            "/etc/ld.so.preload": ("/usr/local/vgpu/ld.so.preload", True),
        },
        lock_dir="/tmp/vgpulock",
    )


class FakeRunner:
    """Answers the test program: the control run, then the run under HAMi-core."""

    def __init__(self, control: str, limited: str) -> None:
        self.outputs = [control, limited]
        self.calls: list[tuple[tuple[str, ...], dict[str, str]]] = []

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Ran:
        self.calls.append((tuple(argv), dict(env or {})))
        return Ran(tuple(argv), 0, self.outputs.pop(0), "")


ALL_OK = "runtime 256 ok\nruntime 3072 ok\ndriver 256 ok\ndriver 3072 ok\n"
LIMITED = (
    "runtime 256 ok\nruntime 3072 fail cudaErrorMemoryAllocation\n"
    "driver 256 ok\ndriver 3072 fail CUDA_ERROR_OUT_OF_MEMORY\n"
)


def test_step3_limit_enforced(tmp_path: Path) -> None:
    answer = _answer(tmp_path)
    run = FakeRunner(ALL_OK, LIMITED)
    checks = gpucheck_cuda.limit_checks(answer, "/x/memcheck", "/x/libvgpu.so", {}, run)
    assert [(c.name, c.status) for c in checks] == [
        ("step3 under the limit", "PASS"),
        ("step3 past the limit", "PASS"),
    ]
    assert "runtime cudaErrorMemoryAllocation" in checks[1].detail
    (control_argv, control_env), (_, env) = run.calls
    assert control_argv == ("/x/memcheck", "256", "3072")
    assert "LD_PRELOAD" not in control_env
    assert (control_env["CUDA_VISIBLE_DEVICES"], control_env["CUDA_DEVICE_ORDER"]) == (
        "2",
        "PCI_BUS_ID",
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "2"
    assert env["LD_PRELOAD"] == "/x/libvgpu.so"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
    # the container path of the cache, mapped through the answer's mount to the host
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == str(tmp_path / "containers/uid_c0/abc.cache")
    assert (tmp_path / "lock").is_dir()


def test_step3_limit_not_enforced_is_a_failure(tmp_path: Path) -> None:
    run = FakeRunner(ALL_OK, ALL_OK)
    checks = gpucheck_cuda.limit_checks(_answer(tmp_path), "/p", "/l.so", {}, run)
    assert [c.status for c in checks] == ["PASS", "FAIL"]
    assert "runtime ok, driver ok" in checks[1].detail


def test_step3_control_run_must_allocate(tmp_path: Path) -> None:
    run = FakeRunner("runtime 3072 fail cudaErrorMemoryAllocation\n", "")
    [check] = gpucheck_cuda.limit_checks(_answer(tmp_path), "/p", "/l.so", {}, run)
    assert check.status == "FAIL"
    assert "control run without HAMi-core" in check.detail


def test_step3_skips_saying_why(tmp_path: Path) -> None:
    answer = _answer(tmp_path)
    nothing = {"PATH": str(tmp_path / "empty"), "CUDA_HOME": str(tmp_path / "nocuda")}
    tools = gpucheck_cuda.find_toolchain(nothing)
    if tools.nvcc is not None:  # /usr/local/cuda exists on this machine
        pytest.skip("a CUDA toolkit is installed at /usr/local/cuda")
    [check] = gpucheck_cuda.step3(answer, tmp_path, nothing, FakeRunner("", ""))
    assert (check.status, check.name) == ("SKIP", "step3 hami-core")
    assert "no CUDA toolkit" in check.detail
    assert "nvcc missing" in check.detail


def test_step3_hamicore_sources(tmp_path: Path) -> None:
    tools = gpucheck_cuda.Toolchain("/cuda/bin/nvcc", "/usr/bin/cc", "/usr/bin/cmake")
    library, why = gpucheck_cuda.hamicore_library(tools, tmp_path, {}, FakeRunner("", ""))
    assert library is None
    assert "set HAMI_CORE_SRC" in why
    source = tmp_path / "HAMi-core"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("project(libvgpu)\n")
    env = {"HAMI_CORE_SRC": str(source)}

    def cmake(argv: Sequence[str], **_: Any) -> Ran:
        if "--build" in argv:
            lib = tmp_path / "hamicore-build" / "libvgpu.so"
            lib.parent.mkdir(parents=True, exist_ok=True)
            lib.write_bytes(b"\x7fELF")
        return Ran(tuple(argv), 0, "", "")

    library, why = gpucheck_cuda.hamicore_library(tools, tmp_path, env, cmake)
    assert library == str(tmp_path / "hamicore-build" / "libvgpu.so")
    assert why == f"built from {source}"

    def broken(argv: Sequence[str], **_: Any) -> Ran:
        return Ran(tuple(argv), 2, "", "cuda.h: No such file or directory")

    library, why = gpucheck_cuda.hamicore_library(tools, tmp_path / "b", env, broken)
    assert library is None
    assert why.startswith("HAMi-core did not build here")
    assert "cuda.h" in why


def test_step3_hamicore_not_building_is_skipped_saying_why(tmp_path: Path) -> None:
    """The issue: where HAMi-core cannot be built, the step says so; it is no mismatch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("nvcc", "cc", "cmake"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    source = tmp_path / "HAMi-core"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("project(libvgpu)\n")
    env = {"PATH": str(bin_dir), "HAMI_CORE_SRC": str(source)}
    calls: list[tuple[str, ...]] = []

    def broken(argv: Sequence[str], **_: Any) -> Ran:
        calls.append(tuple(argv))
        return Ran(tuple(argv), 2, "", "fatal error: cuda.h: No such file or directory")

    [check] = gpucheck_cuda.step3(_answer(tmp_path), tmp_path, env, broken)
    assert (check.name, check.status) == ("step3 hami-core", "SKIP")
    assert "HAMi-core did not build here" in check.detail
    assert f"nvcc {bin_dir}/nvcc" in check.detail
    assert calls[0][:3] == (f"{bin_dir}/cmake", "-S", str(source))
    assert f"-DCMAKE_SHARED_LINKER_FLAGS=-L{tmp_path}/lib64/stubs" in calls[0]
    assert len(calls) == 1  # no test program without a library to preload


def test_program_source_is_written_whole() -> None:
    src = gpucheck_cuda.PROGRAM
    assert "cudaMalloc" in src and "cuMemAlloc" in src
    assert src.count("{") == src.count("}")
    out = gpucheck_cuda.parse_program_output(LIMITED + "init fail x\n")
    assert out == {
        ("runtime", 256): "ok",
        ("runtime", 3072): "cudaErrorMemoryAllocation",
        ("driver", 256): "ok",
        ("driver", 3072): "CUDA_ERROR_OUT_OF_MEMORY",
    }


CUDA_PROTOTYPES = {
    # the declarations the program uses, as CUDA's headers have them
    "cuda_runtime.h": """#include <stddef.h>
typedef enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 } cudaError_t;
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorName(cudaError_t error);
""",
    "cuda.h": """#include <stddef.h>
typedef enum { CUDA_SUCCESS = 0 } CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree(CUdeviceptr dptr);
CUresult cuGetErrorName(CUresult error, const char **pStr);
""",
}


def test_program_compiles_as_cuda_cxx(tmp_path: Path) -> None:
    """nvcc compiles host code as C++: the program, against CUDA's prototypes, with
    warnings as errors (no GPU and no toolkit needed)."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    for name, text in CUDA_PROTOTYPES.items():
        (tmp_path / name).write_text(text)
    source = tmp_path / "memcheck.cpp"
    source.write_text(gpucheck_cuda.PROGRAM)
    done = subprocess.run(
        [compiler, "-fsyntax-only", "-Wall", "-Werror", "-I", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- step 4


async def test_step4_health_events_registered(mixed: FakeNvml, tmp_path: Path) -> None:
    settings = BackendSettings(options={"sysfs_root": str(tmp_path / "sys")})
    check = await gpucheck.step4_health(settings, mixed)
    assert check.status == "PASS", check.detail
    assert "event set registered on 3 GPU(s)" in check.detail
    assert hex(pynvml.nvmlEventTypeXidCriticalError) in check.detail
    assert sorted(mixed.registered) == sorted(g.uuid for g in mixed.gpus)


async def test_step4_device_without_xid_events_is_skipped_saying_so(tmp_path: Path) -> None:
    class OldNvml(FakeNvml):
        def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
            return int(pynvml.nvmlEventTypeSingleBitEccError)

    nvml = OldNvml([FakeGpu(0, "GPU-old", "Tesla K80", 12 * 2**30, "00000000:04:00.0")])
    check = await gpucheck.step4_health(BackendSettings(), nvml, seconds=5.0)
    assert check.status == "SKIP", check.detail
    assert "no Xid critical error events on GPU-old (supported event types 0x1)" in check.detail


async def test_step4_registration_refused(tmp_path: Path) -> None:
    """NotSupported from the driver: a skip; any other refusal: the device is marked
    unhealthy by the backend, a failure."""

    class Refusing(FakeNvml):
        def __init__(self, gpus: list[FakeGpu], code: int) -> None:
            super().__init__(gpus)
            self.code = code

        def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: object) -> None:
            raise pynvml.NVMLError(self.code)

    gpus = [FakeGpu(0, "GPU-vm", "NVIDIA H200", 2**37, "00000000:19:00.0")]
    check = await gpucheck.step4_health(
        BackendSettings(), Refusing(gpus, pynvml.NVML_ERROR_NOT_SUPPORTED), seconds=5.0
    )
    assert check.status == "SKIP", check.detail
    check = await gpucheck.step4_health(
        BackendSettings(), Refusing(gpus, pynvml.NVML_ERROR_UNKNOWN), seconds=1.0
    )
    assert check.status == "FAIL"
    assert "marked GPU-vm unhealthy while registering" in check.detail


def _scores(smi: list[Any], pairs: dict[tuple[int, int], int]) -> str:
    by_index = {g.index: g.uuid for g in smi}
    table: dict[str, dict[str, int]] = {g.uuid: {} for g in smi}
    for (i, j), score in pairs.items():
        table[by_index[i]][by_index[j]] = score
        table[by_index[j]][by_index[i]] = score
    return json.dumps([{"uuid": u, "score": peers} for u, peers in table.items()])


def test_expected_scores_follow_go_hamis_table() -> None:
    assert gpucheck.expected_scores("NODE") == (20,)
    assert gpucheck.expected_scores("SYS") == (10,)
    assert gpucheck.expected_scores("PIX") == (50,)
    nv = gpucheck.expected_scores("NV12")
    assert nv is not None and nv[0] == 1200 and 1260 in nv and 1230 in nv
    assert gpucheck.expected_scores("X") is None


def test_topology_scores_are_compared_with_topo_m() -> None:
    smi, topo = parse_smi_query(MIXED_QUERY), parse_topo(MIXED_TOPO)
    right = _scores(smi, {(0, 1): 20, (0, 2): 10, (1, 2): 10})
    check = gpucheck.compare_scores(smi, topo, right, option_on=True)
    assert check.status == "PASS", check.detail
    wrong = _scores(smi, {(0, 1): 50, (0, 2): 10, (1, 2): 10})
    check = gpucheck.compare_scores(smi, topo, wrong, option_on=True)
    assert check.status == "FAIL"
    assert "GPU0-GPU1 NODE: hami [50], expected (20,)" in check.detail
    missing = _scores(smi, {(0, 1): 20, (0, 2): 10})
    assert gpucheck.compare_scores(smi, topo, missing, option_on=True).status == "FAIL"
    assert gpucheck.compare_scores(smi, topo, None, option_on=True).status == "FAIL"
    assert gpucheck.compare_scores(smi, topo, "{not json", option_on=True).status == "FAIL"
    assert gpucheck.compare_scores(smi, topo, None, option_on=False).status == "SKIP"
    single = parse_topo(H200_TOPO)
    assert gpucheck.compare_scores(smi[:1], single, None, option_on=True).status == "SKIP"


async def test_step4_topology_runs_the_backend_against_topo_m() -> None:
    smi = parse_smi_query(MIXED_QUERY)
    gpus = [
        FakeGpu(g.index, g.uuid, g.name, g.memory_mib * 2**20, f"00000000:{g.index + 1:02x}:00.0")
        for g in smi
    ]
    for gpu in gpus:
        gpu.numa_node = 0 if gpu.index < 2 else 1  # the fake's default level: NODE or SYSTEM
    check = await gpucheck.step4_topology(
        BackendSettings(), FakeNvml(gpus), smi, parse_topo(MIXED_TOPO), ""
    )
    assert check.status == "PASS", check.detail
    assert "3 pair(s) match" in check.detail
    gpus[2].numa_node = 0  # now the fake says NODE where topo -m says SYS
    check = await gpucheck.step4_topology(
        BackendSettings(), FakeNvml(gpus), smi, parse_topo(MIXED_TOPO), ""
    )
    assert check.status == "FAIL", check.detail


# --------------------------------------------------------------------------- whole run


def _fake_smi(tmp_path: Path, query: str, topo: str) -> str:
    """A nvidia-smi answering the query, topo -m and the driver version from files."""
    data = tmp_path / "smi"
    data.mkdir()
    (data / "query").write_text(query)
    (data / "topo").write_text(topo)
    return _bin_dir(
        tmp_path,
        "#!/bin/sh\n"
        f'case "$*" in\n'
        f'  "--query-gpu=uuid,name,memory.total --format=csv") cat {data}/query ;;\n'
        f'  "--query-gpu=uuid --format=csv,noheader") tail -n +2 {data}/query | cut -d, -f1 ;;\n'
        f'  "topo -m") cat {data}/topo ;;\n'
        f'  "--query-gpu=driver_version --format=csv,noheader") echo 580.159.03 ;;\n'
        # three GPUs without MIG: step 5 says so and reads nothing more
        f'  "--query-gpu=index,mig.mode.current --format=csv,noheader") '
        f'printf "0, [N/A]\\n1, [N/A]\\n2, [N/A]\\n" ;;\n'
        f'  *) echo "unexpected: $*" >&2; exit 2 ;;\n'
        "esac\n",
    )


@pytest.fixture
def fake_gpu_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    path = _fake_smi(tmp_path, MIXED_QUERY, MIXED_TOPO)
    for tool in ("cat", "tail", "cut"):
        found = shutil.which(tool)
        assert found
        (Path(path) / tool).symlink_to(found)
    monkeypatch.setenv("PATH", path)
    yield path


def test_nvml_not_starting_under_a_listed_gpu_is_one_line_and_a_failure(
    fake_gpu_path: str, tmp_path: Path
) -> None:
    nvml = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = gpucheck.main([], Options(nvml=nvml, hami_devices=in_process_hami_devices(nvml)))
    assert code == 1
    assert out.getvalue().count("\n") == 1
    assert "nvidia-smi lists 3 GPU(s) but NVML does not start" in out.getvalue()
    assert "kernel driver is not loaded" in out.getvalue()


def test_configuration_errors_name_the_file_and_the_key(
    fake_gpu_path: str, mixed: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 with the configuration's own message; a relative --config is the caller's."""
    options = Options(nvml=mixed, env={"GPU_CHECK_CALLER_DIR": str(tmp_path)})
    assert gpucheck.main(["--config", "site.yaml"], options) == 2
    assert f"cannot read config file {tmp_path}/site.yaml" in capsys.readouterr().err
    (tmp_path / "site.yaml").write_text("backends:\n  nvidia:\n    sysfs_rot: /sys\n")
    assert gpucheck.main(["--config", "site.yaml"], options) == 2
    assert "config key backends.nvidia.sysfs_rot: unknown key" in capsys.readouterr().err


@pytest.mark.controlplane
def test_whole_check_on_the_real_control_plane(
    controlplane: ControlPlane, mixed: FakeNvml, fake_gpu_path: str, tmp_path: Path
) -> None:
    """Steps 1-6 with the fake driver: the slice pod lands on a node agent with the NVIDIA
    backend, kubelet's Allocate answer names a real (fixture) uuid, the limits and mounts."""
    # The fake driver's topology as MIXED_TOPO shows it: the V100s under one host bridge
    # pair on one NUMA node (NODE), the T4 across the CPUs (SYS, the fake's default).
    mixed.ancestors[frozenset((0, 1))] = pynvml.NVML_TOPOLOGY_NODE
    options = Options(
        nvml=mixed,
        hami_devices=in_process_hami_devices(mixed),
        plane=controlplane,
        env={"PATH": fake_gpu_path},  # no nvcc: step 3 says why it is skipped
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = gpucheck.main(["--config", str(_config(tmp_path))], options)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("gpu-check on ")
    assert "driver 580.159.03" in lines[0]
    assert "GPU2 Tesla T4 (15360 MiB)" in lines[0]
    statuses = {line.split(":")[0].split(" ", 1)[1]: line.split(" ")[0] for line in lines[1:-1]}
    uuids = [g.uuid for g in mixed.gpus]
    assert statuses == {
        f"step1 GPU0 {uuids[0]}": "PASS",
        f"step1 GPU1 {uuids[1]}": "PASS",
        f"step1 GPU2 {uuids[2]}": "PASS",
        "step2 NVIDIA_VISIBLE_DEVICES": "PASS",
        "step2 limits": "PASS",
        "step2 mounts": "PASS",
        "step3 hami-core": "SKIP",
        "step4 health events": "PASS",
        "step4 topology scores": "PASS",
        "step5 MIG": "SKIP",
    }, out.getvalue()
    assert "GPU0 no MIG, GPU1 no MIG, GPU2 no MIG" in out.getvalue()
    assert lines[-1] == "gpu-check OK: 8 passed, 0 failed, 2 skipped"
    assert code == 0
    left = [n for n in asyncio.run(_node_names(controlplane.kubeconfig)) if "gpu-check" in n]
    assert left == []  # the shared control plane keeps no node of the check


async def _node_names(kubeconfig: Path) -> list[str]:
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        nodes = await client.CoreV1Api(api).list_node()
    return [n.metadata.name for n in nodes.items]
