#!/usr/bin/env bash
# Renders docker/manifests from the Helm chart (charts/hami is the one source of the
# deployment): `helm template` with the chart's defaults for a release "hami" in namespace
# hami-system, plus what plain manifests need and a cluster would tell helm (the Namespace
# object, the ServiceMonitor, the Kubernetes version that kube-scheduler's tag follows).
# The Grafana dashboards stay out: they are charts/hami/dashboards/*.json themselves, and a
# copy here would go stale with every dashboard edit (docs/operations.md has the one
# kubectl command that makes their ConfigMap).
# One file per chart template, so `kubectl apply -f docker/manifests/` applies in order.
#   gen-manifests.sh [OUT_DIR]   write there instead of docker/manifests (the test that the
#                                committed manifests are up to date uses it)
#   HELM  the helm binary (default: the one `make controlplane` builds into the cache)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/docker/manifests}"
kube_version="$(awk '/^require k8s.io\/kubernetes /{print $3}' "$root/tests/controlplane/go.mod")"
cache="${HAMI_CONTROLPLANE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hami/controlplane/${kube_version}}"
helm="${HELM:-$cache/helm}"
if [ ! -x "$helm" ]; then
  echo "gen-manifests: no helm at $helm; run \`make controlplane\` or set HELM" >&2
  exit 2
fi
rendered="$(mktemp)"
trap 'rm -f "$rendered"' EXIT
"$helm" template hami "$root/charts/hami" --namespace hami-system \
  --kube-version "$kube_version" \
  --api-versions monitoring.coreos.com/v1/ServiceMonitor \
  --set createNamespace=true --set prometheus.enabled=true --set dashboards.enabled=false \
  > "$rendered"
mkdir -p "$out"
rm -f "$out"/*.yaml
# Split at helm's "# Source: hami/templates/<file>" lines; a file's objects stay in the
# order helm prints them (its install order).
awk -v out="$out" '
  /^# Source: hami\/templates\// {
    n = split($3, parts, "/"); file = out "/" parts[n]; blank = 0
    if (!(file in seen)) {
      seen[file] = 1
      print "# Generated from charts/hami by scripts/gen-manifests.sh: do not edit; change the" > file
      print "# chart, then run `make manifests` (a test fails while these differ from the chart)." > file
    }
    print "---" > file
    next
  }
  /^---$/ { next }
  file == "" { next }
  /^[ \t]*$/ { blank++; next }   # kept only inside an object, not at its end
  { for (; blank > 0; blank--) print "" > file; print > file }
' "$rendered"
echo "gen-manifests: wrote $(ls "$out"/*.yaml | wc -l) files to $out" >&2
