#!/usr/bin/env bash
# Builds kube-apiserver, kube-scheduler and kube-controller-manager (from go.mod's pinned
# Kubernetes; the DRA tests run its resourceclaim controller), etcd and helm
# (helm/go.mod pins it; the chart tests use it) into the cache directory; a no-op when
# everything is already there.
#   HAMI_CONTROLPLANE_DIR  cache directory (default ~/.cache/hami/controlplane/<version>)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(awk '/^require k8s.io\/kubernetes /{print $3}' "$here/go.mod")"
out="${HAMI_CONTROLPLANE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hami/controlplane/${version}}"
mkdir -p "$out"
# Stamp the version the way Kubernetes' own build does (hack/lib/version.sh), so
# `/version` and `--version` say v1.X.Y instead of v0.0.0-master.
minor="$(echo "$version" | cut -d. -f2)"
vflags=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  vflags="$vflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  vflags="$vflags -X $pkg.gitTreeState=clean"
done
# Runs "$@" while a background ticker says every ${HAMI_BUILD_TICK:-20}s what is being built
# and for how long (a cold go build is otherwise silent for minutes); returns "$@"'s status.
ticking() {
  local what="$1" tick="${HAMI_BUILD_TICK:-20}" start rc=0 ticker
  shift
  start=$(date +%s)
  (
    # stop the pending sleep too, or it holds stderr open until it ends
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    while :; do
      sleep "$tick" &
      nap=$!
      wait "$nap"
      echo "controlplane: still building ${what} ($(( $(date +%s) - start ))s so far)" >&2
    done
  ) &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  return "$rc"
}
build_kubernetes() {
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $vflags" -o "$out/" "$@")
}
build_etcd() {
  (cd "$here/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
}
build_helm() {
  (cd "$here/helm" && CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version" \
    -o "$out/helm" helm.sh/helm/v4/cmd/helm)
}
need=()
for bin in kube-apiserver kube-scheduler kube-controller-manager; do
  # rebuild when missing or built for another version
  "$out/$bin" --version 2>/dev/null | grep -qx "Kubernetes $version" || need+=("k8s.io/kubernetes/cmd/$bin")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "controlplane: building ${need[*]} at ${version} into ${out} (cold build: ~7 min on 2 cores)" >&2
  start=$(date +%s)
  ticking "${need[*]##*/}" build_kubernetes "${need[@]}"
  echo "controlplane: built in $(( $(date +%s) - start ))s" >&2
fi
if [ ! -x "$out/etcd" ]; then
  echo "controlplane: building etcd into ${out}" >&2
  ticking etcd build_etcd
fi
helm_version="$(awk '/^require helm.sh\/helm\/v4 /{print $3}' "$here/helm/go.mod")"
# rebuild when missing or built for another version
if [ "$("$out/helm" version --template '{{.Version}}' 2>/dev/null)" != "$helm_version" ]; then
  echo "controlplane: building helm ${helm_version} into ${out} (cold build: ~3 min on 2 cores)" >&2
  ticking helm build_helm
fi
ls -l "$out" >&2
echo "$out"
