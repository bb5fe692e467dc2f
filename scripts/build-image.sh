#!/usr/bin/env bash
# `make image`: builds docker/Dockerfile, the one image of both roles, with the first OCI
# builder here that can run: docker (its daemon must answer `docker info`), podman or
# buildah. When none can, says why in one line and exits 1. Release images (linux/amd64
# and linux/arm64, SBOM, signature) are built by .github/workflows/release.yaml.
#
#   bash scripts/build-image.sh
#
# Environment: IMAGE (default: the chart's default image, ghcr.io/hami-py/hami),
# TAG (default: the version in pyproject.toml, which is the chart's appVersion),
# IMAGE_BUILDER (docker, podman or buildah: only that one), PLATFORM (e.g. linux/arm64).
set -euo pipefail
cd "$(dirname "$0")/.."

image="${IMAGE:-ghcr.io/hami-py/hami}"
tag="${TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)}"
builders="${IMAGE_BUILDER:-docker podman buildah}"

first_line() { # the first non-empty line of a command's output, for a one-line reason
    local line
    while IFS= read -r line; do
        if [ -n "$line" ]; then
            echo "$line"
            return
        fi
    done
}

reasons=()
chosen=""
for builder in $builders; do
    case "$builder" in docker | podman | buildah) ;; *)
        echo "make image: IMAGE_BUILDER=$builder: not one of docker, podman, buildah" >&2
        exit 2
        ;;
    esac
    if ! command -v "$builder" >/dev/null 2>&1; then
        reasons+=("$builder: not installed")
        continue
    fi
    # docker needs its daemon; podman and buildah need none but fail the same way when
    # they cannot run here (no user namespaces, no storage).
    # stderr only: docker prints its client section on stdout before the error
    if ! said=$(timeout 20 "$builder" info 2>&1 >/dev/null </dev/null); then
        why=$(first_line <<<"$said")
        if [ -z "$why" ]; then
            why="'$builder info' gave no answer in 20 s"
        fi
        if [ "$builder" = docker ]; then
            reasons+=("docker: installed but its daemon does not answer ($why)")
        else
            reasons+=("$builder: installed but '$builder info' fails ($why)")
        fi
        continue
    fi
    chosen=$builder
    break
done

if [ -z "$chosen" ]; then
    if [ "${#reasons[@]}" -eq 0 ] || ! printf '%s\n' "${reasons[@]}" | grep -qv 'not installed'; then
        echo "make image: no OCI image builder here (docker, podman or buildah); install one, or let the release workflow build it (.github/workflows/release.yaml)" >&2
    else
        joined=$(printf '%s; ' "${reasons[@]}")
        echo "make image: cannot build the image here: ${joined%; }" >&2
    fi
    exit 1
fi

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
args=(-f docker/Dockerfile -t "$image:$tag" --build-arg "REVISION=$revision" --build-arg "BUILD_DATE=$build_date")
if [ -n "${PLATFORM:-}" ]; then
    args+=(--platform "$PLATFORM")
fi
echo "make image: building $image:$tag with $chosen"
if [ "$chosen" = buildah ]; then
    buildah bud "${args[@]}" .
else
    "$chosen" build "${args[@]}" .
fi
echo "make image: built $image:$tag"
