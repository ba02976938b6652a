"""What a task may ask of Brook while it runs: who it is, this process's MongoDB client,
`submit` (a follow-up job, with the arguments of `Client.submit`), `progress` (how far it
got), `transaction` (its MongoDB writes, committed together with its completion) and
`parent_results` (what the jobs it depends on returned).

An `async def` task gets a `TaskContext` (`await ctx.submit(...)`, `async with
ctx.transaction() as session`); a plain `def` task runs on a worker thread and gets a
`SyncTaskContext` (`ctx.submit(...)` returns the job, `with ctx.transaction() as session`),
whose calls without a session run on the worker process's event loop. Either way they go
through this process's own clients, created in this process (`executor.clients`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.synchronous.client_session import ClientSession
from pymongo.synchronous.database import Database

from common.operations.client_core import ClientCore, Submitting
from common.runtime.blocking import Coro, T, blocking_or_in_session, delegating, run_on
from common.runtime.log import get_logger
from common.runtime.settings import Settings
from common.store.db import database, sync_database
from executor.clients import process_client, process_core, process_sessions, process_sync_client
from executor.progress import ProgressReporter, check_progress
from executor.transaction import AttemptTransaction

__all__ = ["SyncTaskContext", "TaskContext", "process_client", "process_core"]


@dataclass(frozen=True, kw_only=True)
class BaseContext:
    job_id: str
    attempt: int
    task: str
    # The worker's own settings, the MongoDB password included: only this process's clients
    # read them. A task sees `settings`, without the password.
    process_settings: Settings = field(repr=False)
    log: Any = field(default_factory=get_logger)
    reporter: ProgressReporter | None = None
    tx: AttemptTransaction | None = None

    @property
    def settings(self) -> Settings:
        """The settings this worker runs with, the password of `mongo_uri` replaced by
        `***` (a task talks to MongoDB through `ctx.database()`, never through the URI)."""
        return self.process_settings.redacted()

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
        return process_core(self.process_settings)

    def _attempt_tx(self) -> AttemptTransaction:
        if self.tx is None:
            raise RuntimeError("ctx.transaction() needs a running attempt of a Brook worker")
        return self.tx


@dataclass(frozen=True, kw_only=True)
class TaskContext(BaseContext):
    """The context of an `async def` task."""

    def database(self) -> AsyncDatabase[dict[str, Any]]:
        """Brook's database through this worker process's own client."""
        return database(process_client(self.process_settings), self.process_settings)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncClientSession]:
        """`async with ctx.transaction() as session:` — write through `session` (any database
        of `session.client`); when the task returns, the job's completion and these writes
        commit together, fenced by attempt and owner. A lost lease, an exception or a dead
        worker aborts them. One per attempt; it commits when the task returns, not when the
        block ends."""
        return self._attempt_tx().open_async(process_client(self.process_settings))

    submit = delegating(Submitting.submit)

    async def parent_results(self) -> dict[str, Any]:
        """`{parent job id: result}` for this job's `depends_on`, in that order."""
        return await self._target().parent_results(self.job_id)


@dataclass(frozen=True, kw_only=True)
class SyncTaskContext(BaseContext):
    """The context of a plain `def` task (it runs on a worker thread)."""

    loop: asyncio.AbstractEventLoop

    def database(self) -> Database[dict[str, Any]]:
        """Brook's database through this worker process's own blocking client."""
        return sync_database(process_sync_client(self.process_settings), self.process_settings)

    def transaction(self) -> contextlib.AbstractContextManager[ClientSession]:
        """`with ctx.transaction() as session:` — as `TaskContext.transaction`, with a
        blocking session of this worker process's blocking client."""
        return self._attempt_tx().open_sync(process_sync_client(self.process_settings))

    def _block(self, coro: Coro[T]) -> T:
        return run_on(self.loop, coro)

    def _session_target(self) -> Submitting:
        return process_sessions(self.process_settings)

    submit = blocking_or_in_session(Submitting.submit)

    def parent_results(self) -> dict[str, Any]:
        """`{parent job id: result}` for this job's `depends_on`, in that order."""
        return self._block(self._target().parent_results(self.job_id))
