"""The DB factory: one `AsyncMongoClient` per process, created in that process; how
Brook reads and writes (majority), which failures are transient, and index creation.

Every Brook process (API, dispatcher, each worker that touches MongoDB) calls
`make_client()` itself; a client is never handed to a child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from datetime import UTC
from typing import Any

import pymongo
from bson.codec_options import CodecOptions, DatetimeConversion
from pymongo import AsyncMongoClient, IndexModel, MongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError, WTimeoutError
from pymongo.read_concern import ReadConcern
from pymongo.synchronous.database import Database
from pymongo.write_concern import WriteConcern

from brook.common.domain.models import Doc
from brook.common.runtime.settings import Settings

REPLSET_NAME = "brook"
MAJORITY = WriteConcern(w="majority")
MAJORITY_READ = ReadConcern("majority")
# A date BSON holds but `datetime` cannot (after year 9999, before year 1: an application's
# document a trigger copies, say) is read as a `bson.DatetimeMS`, never as an error: the
# default would fail the whole read (a change stream's batch, a claim) with `InvalidBSON`.
DATETIMES = DatetimeConversion.DATETIME_AUTO
# How Brook reads its documents whatever client it is given (an application's client may
# decode datetimes as naive ones, or documents as another class).
CODEC: CodecOptions[Doc] = CodecOptions(
    document_class=dict, tz_aware=True, tzinfo=UTC, datetime_conversion=DATETIMES
)


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
    """Build this process's client: majority writes, majority reads, tz-aware UTC datetimes
    (and `DATETIMES`: a date out of `datetime`'s range is read, not an error)."""
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
        "datetime_conversion": DATETIMES,
        "appname": f"{appname}:{os.getpid()}",
        "serverSelectionTimeoutMS": settings.server_selection_timeout_ms,
        "connectTimeoutMS": settings.mongo_connect_timeout_ms,
    }
    if settings.mongo_socket_timeout_ms is not None:
        # Bounds every operation's wait for a reply; index builds, which may take longer,
        # raise their own bound (`INDEX_BUILD_S`).
        options["socketTimeoutMS"] = settings.mongo_socket_timeout_ms
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


def is_transient_code(code: object) -> bool:
    """A server error code that says "not now" (an election, a shutdown), not "never"."""
    return code in _TRANSIENT_CODES


def is_transient(exc: BaseException) -> bool:
    """Failures classified in one place: worth retrying (no primary, network, failover),
    as opposed to errors that will fail the same way again (bad document, bad query)."""
    if isinstance(exc, (ConnectionFailure, WTimeoutError)):
        return True  # includes AutoReconnect, NotPrimaryError, ServerSelectionTimeoutError
    if isinstance(exc, OperationFailure):
        labels = ("RetryableWriteError", "TransientTransactionError", "ResumableChangeStreamError")
        return exc.code in _TRANSIENT_CODES or any(exc.has_error_label(lb) for lb in labels)
    return False


# How long an index build may take (a new index over a large collection), in place of the
# socket timeout where one is set (`BROOK_MONGO_SOCKET_TIMEOUT_MS`).
INDEX_BUILD_S = 3600.0


async def ensure_indexes(collection: AsyncCollection[Doc], models: Sequence[IndexModel]) -> None:
    """Idempotent: an index that exists with the same spec is a no-op; one that exists
    under the same name with another spec (an older Brook) is rebuilt."""
    # Only where a socket timeout is set (a timeout here also bounds server selection by
    # itself, in place of the client's own bound).
    bounded = collection.database.client.options.pool_options.socket_timeout is not None
    with pymongo.timeout(INDEX_BUILD_S) if bounded else contextlib.nullcontext():
        try:
            await collection.create_indexes(list(models))
        except OperationFailure as exc:
            if exc.code not in (85, 86):  # IndexOptionsConflict, IndexKeySpecsConflict
                raise
            for model in models:
                await _rebuild_index(collection, model)


async def _rebuild_index(collection: AsyncCollection[Doc], model: IndexModel) -> None:
    # Several processes (API, dispatchers) may do this at once: a peer may drop or
    # recreate the index between our steps, so tolerate both and try again.
    for _ in range(5):
        try:
            await collection.create_indexes([model])
            return
        except OperationFailure as exc:
            if exc.code not in (85, 86):
                raise
        try:
            await collection.drop_index(model.document["name"])
        except OperationFailure as exc:
            if exc.code != 27:  # IndexNotFound: a peer dropped it first
                raise
    await collection.create_indexes([model])
