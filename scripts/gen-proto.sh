#!/usr/bin/env bash
# Regenerates the Python protobuf + grpclib code for the vendored kubelet gRPC APIs, each
# api.proto copied unchanged from k8s.io/kubelet v0.36.2:
#   hami/_proto/v1beta1/api.proto               device plugin API (pkg/apis/deviceplugin/v1beta1)
#   hami/_proto/dra/v1/api.proto                DRA plugin service (pkg/apis/dra/v1)
#   hami/_proto/pluginregistration/v1/api.proto plugin watcher registration (pkg/apis/pluginregistration/v1)
#   gen-proto.sh [OUT_ROOT]   write under OUT_ROOT instead of the repository (used by the
#                             test that checks the committed code is up to date)
# Needs grpcio-tools and grpclib (the dev extras): protoc runs from the repository root so
# the generated imports read `hami._proto.<dir>.api_pb2`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
py="${PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py=python3
plugin="$(dirname "$py")/protoc-gen-grpclib_python"
[ -x "$plugin" ] || plugin="$(command -v protoc-gen-grpclib_python)"
protos=(
  hami/_proto/v1beta1/api.proto
  hami/_proto/dra/v1/api.proto
  hami/_proto/pluginregistration/v1/api.proto
)
cd "$root"
for proto in "${protos[@]}"; do
  mkdir -p "$out/$(dirname "$proto")"
  "$py" -m grpc_tools.protoc -I . \
    --plugin=protoc-gen-grpclib_python="$plugin" \
    --python_out="$out" --pyi_out="$out" --grpclib_python_out="$out" \
    "$proto"
done
