#!/usr/bin/env bash
# Entrypoint of the MongoDB stand-in image (`make images`): the parts of the official
# `mongo` image's docker-entrypoint.sh that compose.yaml and the tests rely on.
#
# - `docker run IMAGE --replSet rs0 ...` (first argument an option) runs `mongod ...`.
# - As root, `mongod` runs as the `mongodb` user (999:999), after /data/db and
#   /data/configdb are made its own.
# - With MONGO_INITDB_ROOT_USERNAME and MONGO_INITDB_ROOT_PASSWORD set and an empty
#   /data/db, a temporary mongod that listens on 127.0.0.1 only (no --replSet, no
#   --keyFile, so no one else can reach it and no auth is needed yet) creates that root user
#   in `admin`, runs /docker-entrypoint-initdb.d/*.sh and *.js, and shuts down; then the
#   real mongod starts with --auth (a --keyFile implies it).
# The password is read by mongosh from the environment, never put on a command line.
set -Eeuo pipefail

if [ "${1:0:1}" = '-' ]; then
    set -- mongod "$@"
fi

if [ "$1" != 'mongod' ]; then
    exec "$@"
fi

dbpath=/data/db
args=("$@")
for ((i = 1; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --dbpath) dbpath="${args[$((i + 1))]}" ;;
        --dbpath=*) dbpath="${args[$i]#--dbpath=}" ;;
    esac
done

if [ "$(id -u)" = '0' ]; then
    mkdir -p "$dbpath" /data/configdb
    chown -R mongodb:mongodb "$dbpath" /data/configdb
    # Re-run this script as the mongodb user, the way the official image does with gosu.
    exec setpriv --reuid=mongodb --regid=mongodb --init-groups "$BASH_SOURCE" "$@"
fi

log() { printf '%s mongo-entrypoint: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

has_data() { compgen -G "$dbpath/WiredTiger*" >/dev/null; }

if [ -n "${MONGO_INITDB_ROOT_USERNAME:-}" ] && [ -n "${MONGO_INITDB_ROOT_PASSWORD:-}" ]; then
    if ! has_data; then
        log "empty $dbpath: creating the root user ${MONGO_INITDB_ROOT_USERNAME} on a local-only mongod"
        # Keep every option but the ones that would let others in or need auth already.
        temp=(mongod)
        for ((i = 1; i < ${#args[@]}; i++)); do
            case "${args[$i]}" in
                --bind_ip | --port | --replSet | --keyFile) i=$((i + 1)) ;;
                --bind_ip=* | --port=* | --replSet=* | --keyFile=* | --bind_ip_all | --auth) ;;
                *) temp+=("${args[$i]}") ;;
            esac
        done
        temp+=(--bind_ip 127.0.0.1 --port 27017 --dbpath "$dbpath"
            --fork --logpath /tmp/mongod-init.log --pidfilepath /tmp/mongod-init.pid)
        "${temp[@]}" >/dev/null
        for ((tries = 0; ; tries++)); do
            if mongosh --quiet --host 127.0.0.1 --port 27017 --eval 'quit(db.adminCommand("ping").ok ? 0 : 1)' >/dev/null 2>&1; then
                break
            fi
            if ((tries >= 60)); then
                log "the temporary mongod did not answer within 60s" >&2
                cat /tmp/mongod-init.log >&2 || true
                exit 1
            fi
            sleep 1
        done
        mongosh --quiet --host 127.0.0.1 --port 27017 admin --eval '
            db.createUser({
              user: process.env.MONGO_INITDB_ROOT_USERNAME,
              pwd: process.env.MONGO_INITDB_ROOT_PASSWORD,
              roles: [{ role: "root", db: "admin" }],
            });' >/dev/null
        for f in /docker-entrypoint-initdb.d/*; do
            case "$f" in
                *.sh) log "running $f"; . "$f" ;;
                *.js) log "running $f"; mongosh --quiet --host 127.0.0.1 --port 27017 \
                    -u "$MONGO_INITDB_ROOT_USERNAME" -p "$MONGO_INITDB_ROOT_PASSWORD" \
                    --authenticationDatabase admin "${MONGO_INITDB_DATABASE:-test}" "$f" ;;
                *) ;;
            esac
        done
        mongod --dbpath "$dbpath" --shutdown >/dev/null
        log "root user created; starting mongod"
    fi
    has_auth=0
    for a in "${args[@]}"; do
        case "$a" in --auth | --keyFile | --keyFile=*) has_auth=1 ;; esac
    done
    if ((has_auth == 0)); then
        set -- "$@" --auth
    fi
fi

exec "$@"
