#!/bin/sh
# One-shot: write the replica set's shared keyfile into the `mongo-keyfile` volume.
#
# Runs in the `keyfile` service of compose.yaml before any mongod starts. The key is
# random, generated on this machine at first start and never committed; later runs keep
# the existing key, so members restarted with `docker compose up` still recognise each
# other. Delete the volume (`docker compose down -v`) to rotate it.
# Usage: keyfile.sh [PATH]   (default /etc/mongo-keyfile/keyfile)
set -eu

KEYFILE="${1:-/etc/mongo-keyfile/keyfile}"   # where mongod reads it (--keyFile)
MONGO_UID="${MONGO_UID:-999}"   # the `mongodb` user of the official mongo image
MONGO_GID="${MONGO_GID:-999}"

if [ -s "$KEYFILE" ]; then
    echo "keyfile: $KEYFILE exists, keeping it"
else
    mkdir -p "$(dirname "$KEYFILE")"
    tmp="$KEYFILE.tmp.$$"
    umask 077
    if command -v openssl >/dev/null 2>&1; then
        openssl rand -base64 756 >"$tmp"
    else
        # Same content shape without openssl: 756 random bytes, base64 (1008 chars).
        head -c 756 /dev/urandom | base64 >"$tmp"
    fi
    mv "$tmp" "$KEYFILE"
    echo "keyfile: generated $KEYFILE"
fi

# mongod refuses a keyfile that others can read; it runs as the mongodb user.
chown "$MONGO_UID:$MONGO_GID" "$KEYFILE"
chmod 400 "$KEYFILE"
