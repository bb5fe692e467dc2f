#!/usr/bin/env bash
# Builds kube-apiserver and kube-scheduler (from go.mod's pinned Kubernetes) and installs
# etcd into the cache directory; a no-op when everything is already there.
#   HAMI_CONTROLPLANE_DIR  cache directory (default ~/.cache/hami/controlplane/<version>)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(awk '/^require k8s.io\/kubernetes /{print $3}' "$here/go.mod")"
out="${HAMI_CONTROLPLANE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hami/controlplane/${version}}"
mkdir -p "$out"
need=()
for bin in kube-apiserver kube-scheduler; do
  [ -x "$out/$bin" ] || need+=("k8s.io/kubernetes/cmd/$bin")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "controlplane: building ${need[*]} at ${version} into ${out} (cold build: ~15-25 min on 2 cores)" >&2
  start=$(date +%s)
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/" "${need[@]}")
  echo "controlplane: built in $(( $(date +%s) - start ))s" >&2
fi
if [ ! -x "$out/etcd" ]; then
  echo "controlplane: building etcd into ${out}" >&2
  (cd "$here/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
fi
ls -l "$out" >&2
echo "$out"
