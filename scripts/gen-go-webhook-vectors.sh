#!/usr/bin/env bash
# Runs the pod specs of scripts/gohami-vectors/webhook/specs.json through Go HAMi's own
# admission webhook and writes tests/data/go-webhook-vectors.json (docs/interop.md "Webhook").
# Go HAMi's module is not served by the Go module proxy, so the program is built in a work
# module outside this repository whose go.mod is Go HAMi's own (same dependency versions) plus
# a replace of Go HAMi by the unpacked tree. Nothing of Go HAMi is copied into this repository.
#   HAMI_GO_COMMIT  Go HAMi commit (default: the one docs/interop.md names)
#   HAMI_SRC        an unpacked Go HAMi tree of that commit (default:
#                   ~/.cache/hami/hami-src/<commit>, unpacked there from HAMI_GIT_DIR)
#   HAMI_GIT_DIR    a git directory holding the commit, used only when HAMI_SRC is missing
#   OUT             vectors file (default tests/data/go-webhook-vectors.json)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
commit="${HAMI_GO_COMMIT:-4707fb02c91c545bc7343ce26dba4c32919f9a3e}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/hami"
src="${HAMI_SRC:-$cache/hami-src/$commit}"
out="${OUT:-$repo/tests/data/go-webhook-vectors.json}"
if [ ! -f "$src/go.mod" ]; then
  git_dir="${HAMI_GIT_DIR:?no Go HAMi tree at $src; set HAMI_SRC, or HAMI_GIT_DIR to a clone holding $commit}"
  echo "gen-go-webhook-vectors: unpacking $commit into $src" >&2
  mkdir -p "$src"
  git --git-dir="$git_dir" archive "$commit" | tar -x -C "$src"
fi
grep -q '^module github.com/Project-HAMi/HAMi$' "$src/go.mod" || {
  echo "gen-go-webhook-vectors: $src is not a Go HAMi source tree" >&2
  exit 2
}
src="$(cd "$src" && pwd -P)"
work="$cache/gohami-vectors/$commit/webhook"
mkdir -p "$work"
cp "$repo/scripts/gohami-vectors/webhook/main.go" "$work/main.go"
# Go HAMi's go.mod as this module's: its requirements pin every dependency to the versions
# Go HAMi builds with; its relative replaces are made absolute.
sed -e 's|^module .*|module hamipy/gohamivectors/webhook|' -e "s|=> \./|=> $src/|" \
  "$src/go.mod" >"$work/go.mod"
cp "$src/go.sum" "$work/go.sum"
printf '\nrequire github.com/Project-HAMi/HAMi v0.0.0\n\nreplace github.com/Project-HAMi/HAMi => %s\n' \
  "$src" >>"$work/go.mod"
export GOMODCACHE="${GOMODCACHE:-$cache/hami-go/$commit/gomodcache}"
export GOCACHE="${GOCACHE:-$cache/hami-go/$commit/gocache}"
export CGO_ENABLED=1 GOFLAGS="-mod=mod -modcacherw"
local_dl="$(go env GOPATH | cut -d: -f1)/pkg/mod/cache/download"
if [ -d "$local_dl" ] && [ "${GOPROXY:-}" != "off" ]; then
  export GOPROXY="file://$local_dl,${GOPROXY:-https://proxy.golang.org,direct}"
fi
command="HAMI_GO_COMMIT=$commit scripts/gen-go-webhook-vectors.sh"
echo "gen-go-webhook-vectors: building and running against $src (cold build takes minutes)" >&2
(cd "$work" && go run . -specs "$repo/scripts/gohami-vectors/webhook/specs.json" \
  -out "$out" -commit "$commit" -command "$command" -go-version "$(go env GOVERSION)")
echo "gen-go-webhook-vectors: wrote $out" >&2
