"""What a task may ask of Brook while it runs: who it is, this process's MongoDB client,
`submit` (a follow-up job, with the arguments of `Client.submit`), and `progress` (how far
it got).

An `async def` task gets a `TaskContext` (`await ctx.submit(...)`); a plain `def` task runs
on a worker thread and gets a `SyncTaskContext` (`ctx.submit(...)` returns the job), whose
calls run on the worker process's event loop. Either way they go through this process's
one client, created in this process.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from common.blocking import Coro, T, blocking, delegating, run_on
from common.core import ClientCore
from common.db import database, make_client
from common.directory import TaskDirectory
from common.log import get_logger
from common.settings import Settings
from common.store import JobStore
from executor.progress import ProgressReporter, check_progress
from executor.registry import registered

_client: AsyncMongoClient[dict[str, Any]] | None = None
_core: ClientCore | None = None


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
        store = JobStore(db, retention_s=settings.retention_seconds)
        _core = ClientCore(store, TaskDirectory(store, registered, open_while_none_live=True))
    return _core


@dataclass(frozen=True, kw_only=True)
class BaseContext:
    job_id: str
    attempt: int
    task: str
    settings: Settings
    log: Any = field(default_factory=get_logger)
    reporter: ProgressReporter | None = None

    def database(self) -> AsyncDatabase[dict[str, Any]]:
        """Brook's database through this worker process's own client (for `async def` tasks)."""
        return database(process_client(self.settings), self.settings)

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far this attempt got: `fraction` in [0, 1], an optional `message`.

        Cheap to call often, from a plain `def` or an `async def` task: reports are
        coalesced to a few a second, and the job shows the latest as `progress`.
        """
        if self.reporter is None:
            check_progress(fraction, message)  # outside a worker: still check the arguments
            return
        self.reporter.report(fraction, message)

    def _target(self) -> ClientCore:
        return process_core(self.settings)


@dataclass(frozen=True, kw_only=True)
class TaskContext(BaseContext):
    """The context of an `async def` task."""

    submit = delegating(ClientCore.submit)


@dataclass(frozen=True, kw_only=True)
class SyncTaskContext(BaseContext):
    """The context of a plain `def` task (it runs on a worker thread)."""

    loop: asyncio.AbstractEventLoop

    def _block(self, coro: Coro[T]) -> T:
        return run_on(self.loop, coro)

    submit = blocking(ClientCore.submit)
