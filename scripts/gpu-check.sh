#!/usr/bin/env bash
# Prove the NVIDIA backend on this machine's real GPU(s) (issue 13): hami devices against
# nvidia-smi, a slice pod's Allocate answer on the local control plane, HAMi-core's memory
# limit where it can be built, NVML health events, and on GPUs in MIG mode the profiles and
# placements the agent reads against `nvidia-smi mig -lgip`/`-lgipp` (read only: MIG mode is
# never changed; MIG off or absent is a SKIP line). One report line per check; exit 1 on any
# FAIL. Without a GPU: one line, exit 0 (CI runs it so). The checks are in
# hami/testkit/gpucheck.py; this is only the entry point.
#
#   bash scripts/gpu-check.sh [--config hami.yaml] [--log-level info]
#
# Environment: HAMI_CORE_SRC (a HAMi-core checkout to build libvgpu.so from) or
# HAMI_CORE_LIB (a built libvgpu.so) for step 3; HAMI_CONTROLPLANE_DIR (etcd, kube-apiserver,
# kube-scheduler; default: the `make controlplane` cache) for step 2; PYTHON for `make install`.
set -euo pipefail
export GPU_CHECK_CALLER_DIR=$PWD # a relative --config is the caller's
cd "$(dirname "$0")/.."

# No GPU, no install: decide before anything prints.
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu-check: no NVIDIA GPU here (nvidia-smi not found); nothing to check"
    exit 0
fi
if ! listed=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>&1) || [ -z "$listed" ]; then
    echo "gpu-check: no NVIDIA GPU here (nvidia-smi: $(echo "${listed:-lists no GPU}" | head -n 1)); nothing to check"
    exit 0
fi

# The project's own environment; installed once, never again while .venv exists. A python
# that already has hami installed (scripts/gpu-check-bundle.sh, for a machine that reaches no
# package index) is used as it is.
if [ -x .venv/bin/python ]; then
    python=.venv/bin/python
elif "${PYTHON:-python3}" -c 'import hami.testkit.gpucheck, importlib.metadata as m; m.version("hami")' \
    >/dev/null 2>&1; then
    python=${PYTHON:-python3}
else
    make install >&2
    python=.venv/bin/python
fi
exec "$python" -m hami.testkit.gpucheck "$@"
