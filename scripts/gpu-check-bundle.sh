#!/usr/bin/env bash
# Pack what scripts/gpu-check.sh needs on a GPU machine that reaches no package index
# (the device machines this project is sometimes lent): the control plane binaries (xz) and
# wheels of hami and of its dependencies that such an image lacks, under .cache/gpucheck/
# (ignored by git). Run it here, where `make controlplane` has built the binaries and pip
# reaches an index; it prints the command to run there. Sizes: about 50 MB in all.
#
#   bash scripts/gpu-check-bundle.sh [PYTHON_VERSION]   # default 3.12, the device image's
set -euo pipefail
cd "$(dirname "$0")/.."

pyver=${1:-3.12}
out=.cache/gpucheck
bin=$(.venv/bin/python -c 'from hami.testkit.controlplane import find_binaries as f; print(f().etcd.parent)')
rm -rf "$out" && mkdir -p "$out/bin" "$out/whl"
for name in etcd kube-apiserver kube-scheduler; do
    xz -T0 -6 -c "$bin/$name" >"$out/bin/$name.xz"
done

# Versions as in this .venv; only what the device image does not already hold.
pins=$(.venv/bin/pip freeze --exclude-editable | grep -iE '^(kubernetes.asyncio|grpclib|h2|hpack|hyperframe|structlog|protobuf|cryptography|cffi|pycparser)==')
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
# shellcheck disable=SC2086  # one argument per pin
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
    --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 -d "$out/whl" $pins
[ -e build ] || made_build=1 # pip builds the hami wheel in ./build
.venv/bin/pip wheel -q --no-deps --no-build-isolation -w "$out/whl" . 2>/dev/null
[ -z "${made_build:-}" ] || rm -rf build

# Step 3 builds libvgpu.so from HAMi-core's sources when they travel too.
hamicore=
if [ -n "${HAMI_CORE_SRC:-}" ]; then
    mkdir -p "$out/HAMi-core"
    tar -C "$HAMI_CORE_SRC" --exclude=./.git --exclude=./build -cf - . | tar -C "$out/HAMi-core" -xf -
    hamicore="HAMI_CORE_SRC=\$PWD/$out/HAMi-core "
fi

du -sh "$out"
cat <<EOF
On the GPU machine, from the repository root, with .cache/gpucheck carried:
python3 -m pip install -q --no-index --no-deps --target /tmp/site .cache/gpucheck/whl/*.whl && export PYTHONPATH=/tmp/site && mkdir -p /tmp/cp && for f in etcd kube-apiserver kube-scheduler; do python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" .cache/gpucheck/bin/\$f.xz >/tmp/cp/\$f && chmod +x /tmp/cp/\$f; done && ${hamicore}HAMI_CONTROLPLANE_DIR=/tmp/cp PYTHON=python3 bash scripts/gpu-check.sh
EOF
