#!/usr/bin/env bash
# `make image`: build the migpart image with buildah and export it as an OCI archive, on a
# machine with no container registry.
#
# The Dockerfile's bases are made here from Debian bookworm packages with mmdebstrap (minbase:
# python3 and ca-certificates; the build stage's base adds python3-venv), cached as tarballs
# under $MIGPART_CACHE/image keyed by what goes into them, and imported into buildah's storage
# ($MIGPART_CACHE/containers, vfs driver: no overlay or fuse needed) with `buildah from scratch`.
# buildah, mmdebstrap and skopeo are installed with apt-get where missing.
#
# Environment: MIGPART_CACHE (default ~/.cache/migpart); DEBIAN_MIRROR (default
# http://deb.debian.org); BASE_IMAGE and BUILD_IMAGE to build FROM pulled images instead (pin
# them by digest, e.g. python:3.11-slim-bookworm@sha256:...); PIP_CA_BUNDLE, the CA bundle pip
# uses in the build (default: the host's, which covers a TLS-intercepting proxy).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${MIGPART_CACHE:-$HOME/.cache/migpart}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org}
SUITE=bookworm
STORAGE=(--root "$CACHE/containers/storage" --runroot "$CACHE/containers/run" --storage-driver vfs)

say() { echo "make image: $*" >&2; }

tools() {
    local missing=()
    command -v buildah >/dev/null || missing+=(buildah)
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    command -v skopeo >/dev/null || missing+=(skopeo)
    if ((${#missing[@]})); then
        if [ "$(id -u)" != 0 ]; then
            say "needs ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root"
            exit 1
        fi
        say "installing ${missing[*]} with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
    fi
}

# base KIND PACKAGES: print the name of the local base image, made and imported when missing.
base() {
    local kind=$1 packages=$2 key name tar ctr
    key=$(printf '%s\n' "$SUITE" "$MIRROR" "$packages" "$(sed -n '/^base()/,/^}/p' "$0")" \
        | sha256sum | cut -c1-16)
    name=localhost/migpart-base:$kind-$key
    if buildah "${STORAGE[@]}" inspect --type image "$name" >/dev/null 2>&1; then
        echo "$name"
        return
    fi
    tar=$CACHE/image/base-$kind-$key.tar
    if [ ! -s "$tar" ]; then
        say "making the $kind base from Debian $SUITE ($packages): a few minutes, once"
        mkdir -p "$CACHE/image"
        # no docs, man pages or translations: nothing in the image reads them
        mmdebstrap --quiet --variant=minbase --include="$packages" --format=tar \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/info/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            "$SUITE" "$tar.part" \
            "deb $MIRROR/debian $SUITE main" \
            "deb $MIRROR/debian $SUITE-updates main" \
            "deb $MIRROR/debian-security $SUITE-security main" >&2
        mv "$tar.part" "$tar"
    fi
    ctr=$(buildah "${STORAGE[@]}" from scratch)
    buildah "${STORAGE[@]}" add --quiet "$ctr" "$tar" / >&2
    buildah "${STORAGE[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd /bin/bash "$ctr" >&2
    buildah "${STORAGE[@]}" commit --quiet --rm "$ctr" "$name" >/dev/null
    buildah "${STORAGE[@]}" tag "$name" "localhost/migpart-base:$kind"
    echo "$name"
}

main() {
    cd "$ROOT"
    tools
    local version revision created epoch source archive image base_image build_image ca
    version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
    revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
    if [ "$revision" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no)" ]; then
        revision=$revision-dirty
    fi
    # the commit's time, not the clock's: the same commit gives the same image metadata
    epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
    created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
    source=$(git config --get remote.origin.url 2>/dev/null || true)
    base_image=${BASE_IMAGE:-$(base runtime python3,ca-certificates)}
    build_image=${BUILD_IMAGE:-$(base build python3,python3-venv,ca-certificates)}
    ca=${PIP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
    image=localhost/migpart:$version
    archive=dist/migpart-$version.oci.tar
    say "building $image from $base_image (build stage: $build_image)"
    buildah "${STORAGE[@]}" bud --isolation chroot --quiet \
        --timestamp "$epoch" \
        --build-arg BASE_IMAGE="$base_image" --build-arg BUILD_IMAGE="$build_image" \
        --build-arg VERSION="$version" --build-arg REVISION="$revision" \
        --build-arg SOURCE="$source" --build-arg CREATED="$created" \
        --build-arg SOURCE_DATE_EPOCH="$epoch" \
        --secret id=pip-ca,src="$ca" \
        --tag "$image" . >/dev/null
    mkdir -p dist
    rm -f "$archive"
    buildah "${STORAGE[@]}" push --quiet "$image" "oci-archive:$archive:migpart:$version" >/dev/null
    local digest size
    digest=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$archive")
    size=$(buildah "${STORAGE[@]}" images --format '{{.Size}}' "$image" | head -1)
    echo "$archive: $(du -h "$archive" | cut -f1) archive, image size $size, digest $digest"
}

main "$@"
