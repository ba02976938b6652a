"""This worker process's MongoDB clients, each created lazily in this process (a client is
never inherited): the `AsyncMongoClient` of `async def` tasks, of `ctx.submit` and of their
transactions; and, only once a plain `def` task asks for the database or a transaction, a
blocking `MongoClient` (a blocking session, usable from the task's thread, must come from
a blocking client).
"""

from __future__ import annotations

import threading
from typing import Any

from pymongo import AsyncMongoClient, MongoClient

from brook.common.client.core import BlockingSessions, ClientCore
from brook.common.client.task_directory import TaskDirectory
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client, make_sync_client, sync_database
from brook.common.store.jobs import JobStore
from brook.executor.registry import registered
from brook.executor.transaction import note_staged

_client: AsyncMongoClient[dict[str, Any]] | None = None
_core: ClientCore | None = None
_sync_client: MongoClient[dict[str, Any]] | None = None
_sessions: BlockingSessions | None = None
_lock = threading.Lock()  # plain `def` tasks run on threads


def process_client(settings: Settings) -> AsyncMongoClient[dict[str, Any]]:
    """One client per worker process, created lazily in that process (the DB factory)."""
    global _client
    if _client is None:
        _client = make_client(settings, appname="brook-worker")
    return _client


def process_core(settings: Settings) -> ClientCore:
    """The Python client's core on this process's client (for `ctx.submit`)."""
    global _core
    if _core is None:
        db = database(process_client(settings), settings)
        store = JobStore(
            db,
            retention_s=settings.retention_seconds,
            query_max_ms=settings.query_max_ms,
        )
        directory = TaskDirectory(store.presence, registered, open_while_none_live=True)
        _core = ClientCore(store, directory, on_staged=note_staged)
    return _core


def process_sync_client(settings: Settings) -> MongoClient[dict[str, Any]]:
    """The blocking client of plain `def` tasks, created on first use in this process."""
    global _sync_client
    with _lock:
        if _sync_client is None:
            _sync_client = make_sync_client(settings, appname="brook-worker-sync")
        return _sync_client


def process_sessions(settings: Settings) -> BlockingSessions:
    """`ctx.submit(..., session=...)` in a plain `def` task's transaction."""
    global _sessions
    client = process_sync_client(settings)
    with _lock:
        if _sessions is None:
            db = sync_database(client, settings)
            _sessions = BlockingSessions(client, db, registered, on_staged=note_staged)
        return _sessions
