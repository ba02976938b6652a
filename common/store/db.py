"""The DB factory: one `AsyncMongoClient` per process, created in that process.

Every Brook process (API, dispatcher, each worker that touches MongoDB) calls
`make_client()` itself; a client is never handed to a child process.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC
from typing import Any

from bson.binary import Binary
from bson.codec_options import CodecOptions
from pymongo import AsyncMongoClient, MongoClient, ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    ConnectionFailure,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
    WTimeoutError,
)
from pymongo.read_concern import ReadConcern
from pymongo.synchronous.database import Database
from pymongo.write_concern import WriteConcern

from common.domain.models import Doc
from common.runtime.settings import Settings

REPLSET_NAME = "brook"
MAJORITY = WriteConcern(w="majority")
MAJORITY_READ = ReadConcern("majority")
# How Brook reads its documents whatever client it is given (an application's client may
# decode datetimes as naive ones, or documents as another class).
CODEC: CodecOptions[Doc] = CodecOptions(document_class=dict, tz_aware=True, tzinfo=UTC)


def embedded_ports(base_port: int) -> list[int]:
    return [base_port, base_port + 1, base_port + 2]


def embedded_uri(base_port: int, replset: str = REPLSET_NAME) -> str:
    hosts = ",".join(f"127.0.0.1:{p}" for p in embedded_ports(base_port))
    return f"mongodb://{hosts}/?replicaSet={replset}"


def resolve_uri(settings: Settings) -> str:
    """`BROOK_MONGO_URI` when set, else the embedded replica set's URI."""
    return settings.mongo_uri or embedded_uri(settings.mongo_port)


def make_client(
    settings: Settings, *, appname: str = "brook", **extra: Any
) -> AsyncMongoClient[Doc]:
    """Build this process's client: majority writes, majority reads, tz-aware UTC datetimes."""
    return AsyncMongoClient(resolve_uri(settings), **_client_options(settings, appname, extra))


def make_sync_client(
    settings: Settings, *, appname: str = "brook", **extra: Any
) -> MongoClient[Doc]:
    """The blocking twin of `make_client`, for a plain `def` task's `ctx.transaction()` (a
    blocking session must come from a blocking client); created in the process using it."""
    return MongoClient(resolve_uri(settings), **_client_options(settings, appname, extra))


def _client_options(settings: Settings, appname: str, extra: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {
        "w": "majority",
        "readConcernLevel": "majority",
        "retryWrites": True,
        "retryReads": True,
        "tz_aware": True,
        "tzinfo": UTC,
        "appname": f"{appname}:{os.getpid()}",
        "serverSelectionTimeoutMS": settings.server_selection_timeout_ms,
    }
    options.update(extra)
    return options


def database(client: AsyncMongoClient[Doc], settings: Settings) -> AsyncDatabase[Doc]:
    return client.get_database(
        settings.db, codec_options=CODEC, write_concern=MAJORITY, read_concern=MAJORITY_READ
    )


def sync_database(client: MongoClient[Doc], settings: Settings) -> Database[Doc]:
    return client.get_database(
        settings.db, codec_options=CODEC, write_concern=MAJORITY, read_concern=MAJORITY_READ
    )


async def ping(client: AsyncMongoClient[Doc], timeout_s: float = 2.0) -> bool:
    """Whether a primary answers `ping` within `timeout_s` (commands read from the primary)."""
    try:
        reply = await asyncio.wait_for(client.admin.command("ping"), timeout_s)
    except (PyMongoError, TimeoutError):
        return False
    return bool(reply.get("ok"))


# Server codes that mean "this member cannot serve you right now" (elections, shutdown).
_TRANSIENT_CODES = frozenset(
    {6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13388, 13435, 13436, 64}
)


# Change-stream errors after which a saved resume token is useless: start a fresh stream
# and sweep. 286 ChangeStreamHistoryLost, 280 ChangeStreamFatalError, 260 InvalidResumeToken,
# 136 CappedPositionLost.
_HISTORY_LOST_CODES = frozenset({286, 280, 260, 136})


def is_history_lost(exc: BaseException) -> bool:
    """The change stream cannot resume from its token (the oplog no longer holds it)."""
    return isinstance(exc, OperationFailure) and (
        exc.code in _HISTORY_LOST_CODES or exc.has_error_label("NonResumableChangeStreamError")
    )


def is_transient(exc: BaseException) -> bool:
    """Failures classified in one place: worth retrying (no primary, network, failover),
    as opposed to errors that will fail the same way again (bad document, bad query)."""
    if isinstance(exc, (ConnectionFailure, WTimeoutError)):
        return True  # includes AutoReconnect, NotPrimaryError, ServerSelectionTimeoutError
    if isinstance(exc, OperationFailure):
        labels = ("RetryableWriteError", "TransientTransactionError", "ResumableChangeStreamError")
        return exc.code in _TRANSIENT_CODES or any(exc.has_error_label(lb) for lb in labels)
    return False



META = "brook_meta"  # small documents of the deployment itself, one per `_id`


async def deployment_secret(db: AsyncDatabase[Doc], name: str) -> bytes:
    """A random secret named `name`, shared by every process of this deployment: made by
    the first process that asks (32 random bytes), kept in MongoDB (majority written), the
    same for every process after it, across restarts."""
    meta = db[META]
    for _ in range(2):  # two first askers at once: one inserts, the other finds it
        try:
            doc = await meta.find_one_and_update(
                {"_id": name},
                {"$setOnInsert": {"secret": Binary(os.urandom(32))}},
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
        except DuplicateKeyError:
            continue
        if doc is not None:
            return bytes(doc["secret"])
    raise RuntimeError(f"no {name} secret in {META}")
