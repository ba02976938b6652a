#!/usr/bin/env bash
# Make sure a Docker engine answers here, for the docker tests (tests/docker) and
# `make images`: install Debian's docker.io, docker-compose and mmdebstrap when missing
# (as root, or through sudo), and start dockerd in the background (log:
# .brook/dockerd.log) when it does not answer. Exit 1, saying why, when it cannot.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { printf 'engine: %s\n' "$*" >&2; }
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO=sudo
fi

if docker info >/dev/null 2>&1; then
    say "the Docker engine answers"
    exit 0
fi

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

mkdir -p "$ROOT/.brook"
log="$ROOT/.brook/dockerd.log"
say "starting dockerd (log: $log)"
# setsid: dockerd must outlive this script and the CI step's process group.
$SUDO setsid dockerd >"$log" 2>&1 </dev/null &
for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        say "the Docker engine answers"
        exit 0
    fi
    sleep 1
done
say "ERROR: dockerd did not start within 60s; the last lines of its log:"
tail -n 20 "$log" >&2 || true
exit 1
