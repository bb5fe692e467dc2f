"""Step 3 of ``scripts/gpu-check.sh``: HAMi-core enforcing the slice's memory limit.

It needs the CUDA toolkit (``nvcc``, to build the test program) and HAMi-core's
``libvgpu.so``: ``HAMI_CORE_LIB`` naming a built one, or ``HAMI_CORE_SRC`` naming a
HAMi-core source tree, built here with CMake and a C compiler. When something is missing the
step is skipped and says what. It never claims a run that did not happen.

The test program allocates device memory under the limit and past it, through the runtime
API (``cudaMalloc``) and the driver API (``cuMemAlloc``). It runs twice: without HAMi-core
(a control: the card itself must grant both sizes) and with ``libvgpu.so`` in ``LD_PRELOAD``
and the environment of the ``Allocate`` answer (its paths mapped through the answer's mounts
to the host, as the container runtime would; ``LD_PRELOAD`` stands in for the answer's
``/etc/ld.so.preload`` mount, since no container runtime runs here).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hami.testkit.gpucheck_run import Answer, Check, Runner

NAME = "step3 hami-core"

#: CMake options HAMi-core's own build.sh passes (hooks and the multi-process limit).
HAMICORE_CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DDLSYM_HOOK_ENABLE=1",
    "-DMULTIPROCESS_LIMIT_ENABLE=1",
    "-DHOOK_MEMINFO_ENABLE=1",
    "-DHOOK_NVML_ENABLE=1",
    "-DHOOK_CUDA_DEPRECATED_ENABLE=1",
)

PROGRAM = r"""// Written by hami's gpu-check (hami/testkit/gpucheck_cuda.py): allocate device memory
// under and past HAMi-core's limit through the runtime and the driver API.
// Prints one line per try: "<api> <MiB> ok" or "<api> <MiB> fail <error name>".
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

static void try_runtime(size_t mib) {
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, mib << 20);
    if (err == cudaSuccess) {
        cudaFree(p);
        printf("runtime %zu ok\n", mib);
    } else {
        printf("runtime %zu fail %s\n", mib, cudaGetErrorName(err));
        cudaGetLastError();
    }
}

static void try_driver(size_t mib) {
    CUdeviceptr p = 0;
    CUresult err = cuMemAlloc(&p, mib << 20);
    if (err == CUDA_SUCCESS) {
        cuMemFree(p);
        printf("driver %zu ok\n", mib);
    } else {
        const char *name = "unknown";
        cuGetErrorName(err, &name);
        printf("driver %zu fail %s\n", mib, name);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s UNDER_MIB OVER_MIB\n", argv[0]);
        return 2;
    }
    size_t under = strtoull(argv[1], NULL, 10), over = strtoull(argv[2], NULL, 10);
    cudaError_t err = cudaSetDevice(0);
    if (err == cudaSuccess) err = cudaFree(0);  /* the primary context, for the driver API */
    if (err != cudaSuccess) {
        printf("init fail %s\n", cudaGetErrorName(err));
        return 3;
    }
    try_runtime(under);
    try_runtime(over);
    try_driver(under);
    try_driver(over);
    return 0;
}
"""


@dataclass(frozen=True)
class Toolchain:
    nvcc: str | None
    cc: str | None
    cmake: str | None

    def describe(self) -> str:
        return ", ".join(
            f"{label} {path or 'missing'}"
            for label, path in (("nvcc", self.nvcc), ("C compiler", self.cc), ("cmake", self.cmake))
        )


def find_toolchain(env: Mapping[str, str]) -> Toolchain:
    path = env.get("PATH", os.defpath)
    nvcc = shutil.which("nvcc", path=path)
    if nvcc is None:
        for home in (env.get("CUDA_HOME"), "/usr/local/cuda"):
            candidate = Path(home or "", "bin", "nvcc")
            if home and candidate.is_file() and os.access(candidate, os.X_OK):
                nvcc = str(candidate)
                break
    cc = shutil.which("cc", path=path) or shutil.which("gcc", path=path)
    return Toolchain(nvcc, cc, shutil.which("cmake", path=path))


def parse_program_output(text: str) -> dict[tuple[str, int], str]:
    """(api, MiB) -> "ok" or the error name."""
    results: dict[tuple[str, int], str] = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 3 and cells[0] in ("runtime", "driver") and cells[1].isdigit():
            outcome = "ok" if cells[2] == "ok" else (cells[3] if len(cells) > 3 else "fail")
            results[(cells[0], int(cells[1]))] = outcome
    return results


def host_path(container_path: str, mounts: Mapping[str, tuple[str, bool]]) -> str | None:
    """Where a container path of the answer lies on the host, through its mounts."""
    best: str | None = None
    for target in mounts:
        if (container_path == target or container_path.startswith(target.rstrip("/") + "/")) and (
            best is None or len(target) > len(best)
        ):
            best = target
    if best is None:
        return None
    return mounts[best][0] + container_path[len(best) :]


def step3(answer: Answer, workdir: Path, env: Mapping[str, str], run: Runner) -> list[Check]:
    tools = find_toolchain(env)
    if tools.nvcc is None:
        return [
            Check(NAME, "SKIP", f"no CUDA toolkit to build the test program ({tools.describe()})")
        ]
    library, why = hamicore_library(tools, workdir, env, run)
    if library is None:  # HAMi-core cannot be built here (a failed build too): say why
        return [Check(NAME, "SKIP", f"{why}; toolchain: {tools.describe()}")]
    program = workdir / "memcheck"
    source = workdir / "memcheck.cu"
    source.write_text(PROGRAM)
    built = run([tools.nvcc, "-o", str(program), str(source), "-lcuda"], timeout=300.0)
    if not built.ok:
        return [Check(NAME, "FAIL", f"the test program does not build: {built.why()}")]
    return limit_checks(answer, str(program), library, env, run)


def hamicore_library(
    tools: Toolchain, workdir: Path, env: Mapping[str, str], run: Runner
) -> tuple[str | None, str]:
    """A ``libvgpu.so`` to preload and how it was found, or None and why not."""
    given = env.get("HAMI_CORE_LIB")
    if given:
        if Path(given).is_file():
            return given, f"HAMI_CORE_LIB {given}"
        return None, f"HAMI_CORE_LIB={given} is not a file"
    source = env.get("HAMI_CORE_SRC")
    if not source:
        return None, (
            "HAMi-core sources not here (set HAMI_CORE_SRC to a HAMi-core checkout, "
            "or HAMI_CORE_LIB to a built libvgpu.so)"
        )
    if not Path(source, "CMakeLists.txt").is_file():
        return None, f"HAMI_CORE_SRC={source} has no CMakeLists.txt"
    if tools.cmake is None or tools.cc is None:
        return None, "HAMi-core needs cmake and a C compiler to build"
    return build_hamicore(tools, Path(source), workdir / "hamicore-build", env, run)


def build_hamicore(
    tools: Toolchain, source: Path, build: Path, env: Mapping[str, str], run: Runner
) -> tuple[str | None, str]:
    assert tools.cmake is not None and tools.nvcc is not None
    cuda_home = env.get("CUDA_HOME") or str(Path(tools.nvcc).resolve().parent.parent)
    build_env = {**env, "CUDA_HOME": cuda_home}
    # -lcuda -lnvidia-ml at link time: the toolkit's stubs, where no unversioned driver
    # library is installed; at run time the driver's own libraries load.
    stubs = f"-DCMAKE_SHARED_LINKER_FLAGS=-L{cuda_home}/lib64/stubs"
    steps: Sequence[Sequence[str]] = (
        [tools.cmake, "-S", str(source), "-B", str(build), *HAMICORE_CMAKE_OPTIONS, stubs],
        [tools.cmake, "--build", str(build), "--target", "vgpu", "-j", str(os.cpu_count() or 2)],
    )
    for argv in steps:
        ran = run(argv, timeout=600.0, env=build_env)
        if not ran.ok:
            return None, f"HAMi-core did not build here: {ran.why()}"
    found = sorted(build.rglob("libvgpu.so"))
    if not found:
        return None, f"HAMi-core did not build here: no libvgpu.so under {build}"
    return str(found[0]), f"built from {source}"


def limit_checks(
    answer: Answer, program: str, library: str, env: Mapping[str, str], run: Runner
) -> list[Check]:
    # well under (the context may count too) and well past, yet within any card's memory
    under, over = max(1, answer.memory_mib // 8), answer.memory_mib * 3 // 2
    argv = [program, str(under), str(over)]
    plain_env = {**env, **visible(answer)}
    control = run(argv, timeout=120.0, env=plain_env)
    plain = parse_program_output(control.stdout)
    if not control.ok or any(plain.get((api, over)) != "ok" for api in ("runtime", "driver")):
        return [
            Check(
                NAME,
                "FAIL",
                f"control run without HAMi-core could not allocate {over} MiB: "
                f"{plain or control.why()}",
            )
        ]
    limited_env, problem = container_env(answer, library, plain_env)
    if limited_env is None:
        return [Check(NAME, "FAIL", problem)]
    limited = run(argv, timeout=120.0, env=limited_env)
    seen = parse_program_output(limited.stdout)
    checks: list[Check] = []
    for size, want, label in ((under, "ok", "under the limit"), (over, None, "past the limit")):
        outcomes = {api: seen.get((api, size), "no result") for api in ("runtime", "driver")}
        good = all(
            (o == "ok") if want == "ok" else (o not in ("ok", "no result"))
            for o in outcomes.values()
        )
        checks.append(
            Check(
                f"step3 {label}",
                "PASS" if good else "FAIL",
                f"{size} MiB with a {answer.memory_mib} MiB limit: "
                + ", ".join(f"{api} {o}" for api, o in outcomes.items())
                + ("" if limited.ok else f" ({limited.why()})"),
            )
        )
    return checks


def visible(answer: Answer) -> dict[str, str]:
    """The allocated GPU alone, as the container runtime would leave it. HAMi-core reads
    CUDA_VISIBLE_DEVICES as NVML indices, so an index in NVML's (PCI bus) order, not a uuid."""
    return {"CUDA_VISIBLE_DEVICES": str(answer.index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def container_env(
    answer: Answer, library: str, base: Mapping[str, str]
) -> tuple[dict[str, str] | None, str]:
    """The answer's environment as the container would see it, with host paths."""
    envs = dict(answer.envs)
    cache = envs.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "")
    cache_host = host_path(cache, answer.mounts) if cache else None
    if cache and cache_host is None:
        return None, f"CUDA_DEVICE_MEMORY_SHARED_CACHE {cache} is under no mount of the answer"
    if cache_host is not None:
        envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = cache_host
        Path(cache_host).parent.mkdir(parents=True, exist_ok=True)
    for target, (host, _) in answer.mounts.items():
        if target == answer.lock_dir:  # HAMi-core's lock files, shared with the host
            Path(host).mkdir(parents=True, exist_ok=True)
    return {**base, **envs, "LD_PRELOAD": library}, ""
