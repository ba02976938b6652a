#!/usr/bin/env bash
# One-shot: initiate the replica set rs0 over mongo1, mongo2, mongo3, wait for a PRIMARY,
# then create (or update) Brook's own user with only the privileges Brook needs.
#
# Runs in the `mongo-init` service of compose.yaml once all three mongod containers are
# healthy. Idempotent: when `rs.status()` already answers (the set was initiated on an
# earlier `docker compose up`), it changes nothing and only waits for a PRIMARY.
# Credentials come from the environment (MONGO_ROOT_USER / MONGO_ROOT_PASSWORD, and
# MONGO_BROOK_USER / MONGO_BROOK_PASSWORD for Brook's user) and are read inside mongosh via
# process.env, so they never appear on a command line or in this container's output.
set -euo pipefail

: "${MONGO_ROOT_USER:?MONGO_ROOT_USER must be set}"
: "${MONGO_ROOT_PASSWORD:?MONGO_ROOT_PASSWORD must be set}"
: "${MONGO_BROOK_PASSWORD:?MONGO_BROOK_PASSWORD must be set}"
MONGO_BROOK_USER="${MONGO_BROOK_USER:-brook}"
BROOK_DB="${BROOK_DB:-brook}"
export MONGO_ROOT_USER MONGO_ROOT_PASSWORD MONGO_BROOK_USER MONGO_BROOK_PASSWORD BROOK_DB

RS_NAME="rs0"
MEMBERS=("mongo1:27017" "mongo2:27017" "mongo3:27017")
SEED="${MEMBERS[0]}"
WAIT_SECONDS="${RS_WAIT_SECONDS:-120}"

log() { printf '%s mongo-init: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

# 1. Every member must answer (the entrypoint restarts mongod once after creating the root
#    user, so a healthy container can still be briefly unreachable).
for member in "${MEMBERS[@]}"; do
    for ((i = 0; ; i++)); do
        if mongosh --quiet "mongodb://${member}/admin?directConnection=true" \
            --eval "quit(db.adminCommand('ping').ok === 1 ? 0 : 1)" >/dev/null 2>&1; then
            log "${member} is up"
            break
        fi
        if ((i >= WAIT_SECONDS)); then
            log "${member} did not answer within ${WAIT_SECONDS}s" >&2
            exit 1
        fi
        sleep 1
    done
done

# 2. Initiate once, then wait for a PRIMARY.
mongosh --quiet "mongodb://${SEED}/admin?directConnection=true" --eval "
const ok = db.getSiblingDB('admin').auth(process.env.MONGO_ROOT_USER, process.env.MONGO_ROOT_PASSWORD);
if (!ok) { print('mongo-init: authentication failed'); quit(1); }

const config = {
  _id: '${RS_NAME}',
  members: [
    { _id: 0, host: 'mongo1:27017', priority: 2 },
    { _id: 1, host: 'mongo2:27017', priority: 1 },
    { _id: 2, host: 'mongo3:27017', priority: 1 },
  ],
};

let initiated = false;
try {
  rs.status();
  initiated = true;
} catch (e) {
  if (e.codeName !== 'NotYetInitialized' && e.code !== 94) { throw e; }
}
if (initiated) {
  print('mongo-init: replica set ${RS_NAME} already initiated, nothing to do');
} else {
  const res = rs.initiate(config);
  if (res.ok !== 1) { printjson(res); quit(1); }
  print('mongo-init: replica set ${RS_NAME} initiated with mongo1, mongo2, mongo3');
}

const deadline = Date.now() + ${WAIT_SECONDS} * 1000;
for (;;) {
  try {
    const primary = rs.status().members.find((m) => m.stateStr === 'PRIMARY');
    if (primary) { print('mongo-init: PRIMARY is ' + primary.name); break; }
  } catch (e) {
    // The set is still electing; rs.status() can fail transiently.
  }
  if (Date.now() > deadline) { print('mongo-init: no PRIMARY within ${WAIT_SECONDS}s'); quit(1); }
  sleep(1000);
}
"

# 3. Brook's own user, on the primary: the role `brook` holds readWrite on BROOK_DB (its
#    collections and change streams), collMod there (post-images for the event streams)
#    and find on local.oplog.rs (the dispatcher's insert hints). No cluster or admin rights:
#    root stays with this one-shot and the nodes' entrypoints.
mongosh --quiet "mongodb://${MEMBERS[0]},${MEMBERS[1]},${MEMBERS[2]}/admin?replicaSet=${RS_NAME}" --eval "
const admin = db.getSiblingDB('admin');
if (!admin.auth(process.env.MONGO_ROOT_USER, process.env.MONGO_ROOT_PASSWORD)) {
  print('mongo-init: authentication failed'); quit(1);
}
// Pre-images (the API turns them on for its jobs collection, for exact live events) live an
// hour, not as long as the oplog holds their change (MongoDB's default).
const images = { preAndPostImages: { expireAfterSeconds: 3600 } };
const set = admin.runCommand({ setClusterParameter: { changeStreamOptions: images } });
if (set.ok === 1) {
  print('mongo-init: change-stream pre-images expire after 3600 s');
} else {
  print('mongo-init: WARNING: pre-images keep MongoDB\'s default expiry: ' + set.errmsg);
}
const brookDb = process.env.BROOK_DB;
const role = {
  privileges: [
    { resource: { db: brookDb, collection: '' }, actions: ['collMod'] },
    { resource: { db: 'local', collection: 'oplog.rs' }, actions: ['find'] },
  ],
  roles: [{ role: 'readWrite', db: brookDb }],
};
if (admin.getRole('brook') === null) {
  admin.createRole({ role: 'brook', ...role });
} else {
  admin.updateRole('brook', role);
}
const user = process.env.MONGO_BROOK_USER;
const spec = { pwd: process.env.MONGO_BROOK_PASSWORD, roles: [{ role: 'brook', db: 'admin' }] };
if (admin.getUser(user) === null) {
  admin.createUser({ user, ...spec });
  print('mongo-init: created user ' + user + ' (role brook on database ' + brookDb + ')');
} else {
  admin.updateUser(user, spec);
  print('mongo-init: updated user ' + user + ' (role brook on database ' + brookDb + ')');
}
"
