#!/usr/bin/env bash
# Builds Go HAMi's scheduler (cmd/scheduler, cgo on) from the source tree named by HAMI_SRC, for
# the interop tests (docs/interop.md). Nothing of HAMi's is copied into this repository: the tree,
# the module and build caches and the binary all live under the cache directory. A no-op when the
# binary for the tree's commit is already there. Prints the binary's path on stdout, progress on
# stderr.
#   HAMI_SRC         Go HAMi source tree (required; e.g. ~/.cache/hami/hami-src/<commit>)
#   HAMI_GO_COMMIT   what to name the cache by (default: HEAD when HAMI_SRC is a git clone, else
#                    the tree's directory name when it is a commit, as `git archive` trees are
#                    unpacked in docs/interop.md, else the tree's VERSION file)
#   HAMI_GO_DIR      cache directory (default ~/.cache/hami/hami-go/<commit>)
#   GOPROXY          as usual; a module already in ~/go/pkg/mod is taken from there first
set -euo pipefail
src="${HAMI_SRC:?HAMI_SRC must name a Go HAMi source tree (see docs/interop.md)}"
[ -f "$src/go.mod" ] && grep -q '^module github.com/Project-HAMi/HAMi$' "$src/go.mod" || {
  echo "build-hami-go: $src is not a Go HAMi source tree (no go.mod for github.com/Project-HAMi/HAMi)" >&2
  exit 2
}
commit="${HAMI_GO_COMMIT:-}"
# Only the tree's own repository names it (not one the tree happens to sit inside).
if [ -z "$commit" ] && [ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$src" && pwd -P)" ]; then
  commit="$(git -C "$src" rev-parse HEAD)"
fi
# A tree unpacked with `git archive` has no .git: name it by its directory when that is a commit.
if [ -z "$commit" ]; then
  base="$(basename "$(cd "$src" && pwd)")"
  if [[ "$base" =~ ^[0-9a-f]{40}$ ]]; then commit="$base"; else commit="$(tr -d '[:space:]' <"$src/VERSION")"; fi
fi
out="${HAMI_GO_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hami/hami-go/${commit}}"
bin="$out/bin/scheduler"
if [ -x "$bin" ]; then
  echo "build-hami-go: $bin already built (commit $commit)" >&2
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "build-hami-go: no go toolchain on PATH" >&2; exit 2; }
command -v gcc >/dev/null || { echo "build-hami-go: cgo needs gcc on PATH" >&2; exit 2; }
mkdir -p "$out/bin" "$out/gomodcache" "$out/gocache"
export GOMODCACHE="$out/gomodcache" GOCACHE="$out/gocache" CGO_ENABLED=1 GOFLAGS="-mod=mod -modcacherw"
# Modules this machine already downloaded (e.g. by `make controlplane`) are read from there first.
local_dl="$(go env GOPATH | cut -d: -f1)/pkg/mod/cache/download"
if [ -d "$local_dl" ] && [ "${GOPROXY:-}" != "off" ]; then
  export GOPROXY="file://$local_dl,${GOPROXY:-https://proxy.golang.org,direct}"
fi
start=$(date +%s)
echo "build-hami-go: downloading modules for $src (commit $commit) into $GOMODCACHE" >&2
(cd "$src" && go mod download -x 2>&1 | grep -c '^# get' | sed 's/^/build-hami-go: modules fetched: /' >&2) || true
echo "build-hami-go: building ./cmd/scheduler (cgo on; cold build takes minutes on 2 cores)" >&2
pkg=github.com/Project-HAMi/HAMi/pkg/version
ldflags="-X $pkg.version=$(tr -d '[:space:]' <"$src/VERSION") -X $pkg.revision=$commit"
log="$out/build.log"
if ! (cd "$src" && go build -v -ldflags "$ldflags" -o "$bin.tmp" ./cmd/scheduler 2>&1 | tee "$log" |
  awk '{n++; if (n % 50 == 0) printf "build-hami-go: %d packages compiled (last: %s)\n", n, $0 > "/dev/stderr"}'); then
  tail -n 30 "$log" >&2
  echo "build-hami-go: go build failed; the whole log is $log" >&2
  exit 1
fi
mv "$bin.tmp" "$bin"
echo "build-hami-go: built $bin in $(($(date +%s) - start))s" >&2
echo "$bin"
