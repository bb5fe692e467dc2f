#!/usr/bin/env bash
# Remakes the Go HAMi vectors the tests compare this project with, by running this project's
# own Go programs under tools/gohami-vectors/ (each with tools/gohami-vectors/common/, their
# shared command line) against a Go HAMi source tree:
#   codec    tools/gohami-vectors/codec/cases.json through Go HAMi's annotation codecs
#            (register, pod devices, node lock, handshake) -> tests/data/hami-go-v2.10.json,
#            checked by tests/test_go_vectors.py
#   webhook  tools/gohami-vectors/webhook/specs.json through Go HAMi's admission webhook
#            -> tests/data/go-webhook-vectors.json, checked by tests/test_webhook_go_parity.py
#   mig      tools/gohami-vectors/mig/cases.json through Go HAMi's dynamic-MIG functions
#            (allow-list, profile choice, vgpu-mig-allocations, register with MIG profiles)
#            -> tests/data/hami-go-v2.10-mig.json, checked by tests/test_mig_go_vectors.py
#   vendors  tools/gohami-vectors/vendors/cases.json through Go HAMi's Cambricon, Hygon and
#            Ascend device functions (node reading, webhook and requests, pod annotations,
#            Ascend's Fit) -> tests/data/go-vendor-vectors.json, checked by
#            tests/test_go_vendor_vectors.py and tests/test_go_ascend_vectors.py
#   filter   tools/gohami-vectors/filter/cases.json through Go HAMi's real scheduler Filter on
#            a fake cluster per case (one per vendor and policy) -> tests/data/go-filter-vectors.json,
#            checked by tests/test_go_filter_vectors.py
# Usage: scripts/gen-go-vectors.sh [codec|webhook|mig|vendors|filter]...   (no argument: all)
# Go HAMi's module is not served by the Go module proxy, so each program is built in a work
# module outside this repository whose go.mod is Go HAMi's own (same dependency versions) plus
# a replace of Go HAMi by the unpacked tree. Nothing of Go HAMi is copied into this repository.
#   HAMI_GO_COMMIT  Go HAMi commit (default: the one docs/interop.md names)
#   HAMI_SRC        an unpacked Go HAMi tree of that commit (default:
#                   ~/.cache/hami/hami-src/<commit>, unpacked there from HAMI_GIT_DIR)
#   HAMI_GIT_DIR    a git directory holding the commit, used only when HAMI_SRC is missing
#   OUT_DIR         where the vectors files go (default tests/data)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
commit="${HAMI_GO_COMMIT:-4707fb02c91c545bc7343ce26dba4c32919f9a3e}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/hami"
src="${HAMI_SRC:-$cache/hami-src/$commit}"
out_dir="${OUT_DIR:-$repo/tests/data}"
generators=("$@")
[ ${#generators[@]} -gt 0 ] || generators=(codec webhook mig vendors filter)
for gen in "${generators[@]}"; do
  case "$gen" in
    codec | webhook | mig | vendors | filter) ;;
    *) echo "gen-go-vectors: unknown generator $gen (codec, webhook, mig, vendors, filter)" >&2; exit 2 ;;
  esac
done
if [ ! -f "$src/go.mod" ]; then
  git_dir="${HAMI_GIT_DIR:?no Go HAMi tree at $src; set HAMI_SRC, or HAMI_GIT_DIR to a clone holding $commit}"
  echo "gen-go-vectors: unpacking $commit into $src" >&2
  mkdir -p "$src"
  git --git-dir="$git_dir" archive "$commit" | tar -x -C "$src"
fi
grep -q '^module github.com/Project-HAMi/HAMi$' "$src/go.mod" || {
  echo "gen-go-vectors: $src is not a Go HAMi source tree" >&2
  exit 2
}
src="$(cd "$src" && pwd -P)"
export GOMODCACHE="${GOMODCACHE:-$cache/hami-go/$commit/gomodcache}"
export GOCACHE="${GOCACHE:-$cache/hami-go/$commit/gocache}"
export CGO_ENABLED=1 GOFLAGS="-mod=mod -modcacherw"
local_dl="$(go env GOPATH | cut -d: -f1)/pkg/mod/cache/download"
if [ -d "$local_dl" ] && [ "${GOPROXY:-}" != "off" ]; then
  export GOPROXY="file://$local_dl,${GOPROXY:-https://proxy.golang.org,direct}"
fi
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"

for gen in "${generators[@]}"; do
  case "$gen" in
    codec) input=cases.json flag=-cases out="$out_dir/hami-go-v2.10.json" ;;
    webhook) input=specs.json flag=-specs out="$out_dir/go-webhook-vectors.json" ;;
    mig) input=cases.json flag=-cases out="$out_dir/hami-go-v2.10-mig.json" ;;
    vendors) input=cases.json flag=-cases out="$out_dir/go-vendor-vectors.json" ;;
    filter) input=cases.json flag=-cases out="$out_dir/go-filter-vectors.json" ;;
  esac
  work="$cache/gohami-vectors/$commit/$gen"
  mkdir -p "$work"
  cp "$repo/tools/gohami-vectors/$gen/main.go" "$work/main.go"
  cp "$repo"/tools/gohami-vectors/common/*.go "$work/"  # the command line they share
  # Go HAMi's go.mod as this module's: its requirements pin every dependency to the versions
  # Go HAMi builds with; its relative replaces are made absolute.
  sed -e "s|^module .*|module hamipy/gohamivectors/$gen|" -e "s|=> \./|=> $src/|" \
    "$src/go.mod" >"$work/go.mod"
  cp "$src/go.sum" "$work/go.sum"
  printf '\nrequire github.com/Project-HAMi/HAMi v0.0.0\n\nreplace github.com/Project-HAMi/HAMi => %s\n' \
    "$src" >>"$work/go.mod"
  command="HAMI_GO_COMMIT=$commit scripts/gen-go-vectors.sh $gen"
  echo "gen-go-vectors: $gen: building and running against $src (a cold build takes minutes)" >&2
  (cd "$work" && TZ=UTC go run . "$flag" "$repo/tools/gohami-vectors/$gen/$input" \
    -out "$out" -commit "$commit" -command "$command" -go-version "$(go env GOVERSION)")
  echo "gen-go-vectors: $gen: wrote $out" >&2
done
