"""`ctx.transaction()`: a task's MongoDB writes, committed together with its completion.

An attempt opens at most one transaction, on this worker process's own client (async in an
`async def` task, blocking in a plain `def` one), and the task writes through its session.
Leaving the `with` block does not commit. When the task returns, the worker writes the
job's completion in that same transaction — fenced by attempt and by the owner of the
lease, exactly as the dispatcher would — and commits the two at once
(`brook.common.store.transactions`); then it tells the dispatcher, which writes nothing more. A lost
lease makes the fence match nothing: the transaction is aborted and the attempt's writes
vanish with its result. A task that raises leaves nothing either; nor does a worker that
dies or is killed before its commit (the dispatcher also ends that worker's server session,
so its locks go at once rather than at the server's transaction lifetime limit).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from pymongo import AsyncMongoClient, MongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import PyMongoError
from pymongo.synchronous.client_session import ClientSession

from brook.common.client.core import log_submitted
from brook.common.domain.errors import LeaseLost
from brook.common.domain.models import Doc
from brook.common.protocol.runner import RunJob, TxOpened
from brook.common.runtime.blocking import drive
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import Lease, Submitted
from brook.common.store.transactions import (
    TASK_TRANSACTION,
    TxEnd,
    TxOps,
    TxSession,
    begin_transaction,
    complete_in_transaction,
    end_transaction,
    on_ops,
    task_ops,
)
from brook.executor.progress import ProgressReporter

# How long a commit whose outcome is unknown (a failover) is retried, at least; then the
# dispatcher decides, by its own fenced write.
MIN_COMMIT_S = 10.0

State = Literal["none", "open", "ready", "ended"]

# The running attempt's transaction: per asyncio task (a shared worker process runs many
# attempts at once), and seen by a plain `def` task's thread.
_current: contextvars.ContextVar[AttemptTransaction | None] = contextvars.ContextVar(
    "brook_attempt_transaction", default=None
)


def note_staged(session: TxSession, staged: Sequence[Submitted]) -> None:
    """Jobs `ctx.submit(..., session=...)` inserted in a transaction: those of the running
    attempt's own transaction are logged once it has committed them, and only then."""
    tx = _current.get()
    if tx is not None and tx.session is session:
        tx.staged.extend(staged)


class AttemptTransaction:
    """The one transaction an attempt may open, from `ctx.transaction()` until the task
    returns (commit) or fails (abort)."""

    def __init__(
        self,
        run: RunJob,
        settings: Settings,
        send: Callable[[TxOpened], None] | None,
        reporter: ProgressReporter | None = None,
    ) -> None:
        self.run = run
        self.settings = settings
        self._send = send
        self._reporter = reporter
        self.state: State = "none"
        self.session: AsyncClientSession | ClientSession | None = None
        self.ops: TxOps | None = None
        self.staged: list[Submitted] = []
        self._marked = False  # the job shows this transaction (`begin_transaction`)

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """While the attempt runs: the transaction `note_staged` adds to."""
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)

    @property
    def opened(self) -> bool:
        return self.state != "none"

    @property
    def lease(self) -> Lease:
        return Lease(job_id=self.run.job_id, attempt=self.run.attempt, shared=self.run.shared)

    # -- the task's side -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def open_async(self, client: AsyncMongoClient[Doc]) -> AsyncIterator[AsyncClientSession]:
        self._claim()
        session = client.start_session()
        ops = self._started(session)
        try:
            self._began(await self._begin(ops, session.session_id))
            await session.start_transaction(**TASK_TRANSACTION)
            self._announce(session)
            yield session
        except BaseException:
            await self.abandon(goes_on=True)
            raise
        self.state = "ready"

    @contextlib.contextmanager
    def open_sync(self, client: MongoClient[Doc]) -> Iterator[ClientSession]:
        # On the task's own thread: the blocking session's calls block, and belong here.
        self._claim()
        session = client.start_session()
        ops = self._started(session)
        try:
            self._began(drive(self._begin(ops, session.session_id)))
            session.start_transaction(**TASK_TRANSACTION)
            self._announce(session)
            yield session
        except BaseException:
            drive(self._end(goes_on=True))
            raise
        self.state = "ready"

    def _claim(self) -> None:
        if self.state != "none":
            raise RuntimeError(
                "ctx.transaction() opens one transaction per attempt; this one already did"
            )
        if not self.run.owner:
            raise RuntimeError("ctx.transaction() needs a running attempt of a Brook worker")
        self.state = "open"

    def _started(self, session: AsyncClientSession | ClientSession) -> TxOps:
        self.session = session
        self.ops = task_ops(session, self.settings)
        return self.ops

    async def _begin(self, ops: TxOps, session_id: Mapping[str, Any]) -> bool:
        lease_s = self.settings.lease_seconds
        return await begin_transaction(ops, self.lease, self.run.owner, session_id, lease_s)

    def _began(self, held: bool) -> None:
        if not held:
            raise LeaseLost(
                f"job {self.run.job_id} attempt {self.run.attempt}: the lease was lost "
                "before its transaction began"
            )
        self._marked = True
        if self._reporter is not None:
            self._reporter.hold()

    def _announce(self, session: AsyncClientSession | ClientSession) -> None:
        if self._send is not None:
            run = self.run
            lsid = dict(session.session_id)
            self._send(TxOpened(job_id=run.job_id, attempt=run.attempt, session_id=lsid))

    # -- the worker's side -----------------------------------------------------------------

    async def finish(self, result: Any, progress: Mapping[str, Any] | None) -> TxEnd:
        """The task returned `result`: commit its completion with its writes."""
        ops, session = self.ops, self.session
        assert ops is not None and session is not None and self.state == "ready"
        try:
            if not session.in_transaction:
                return TxEnd(
                    kind="refused",
                    error={
                        "type": "TransactionEnded",
                        "message": "the task committed or aborted ctx.transaction() itself; "
                        "Brook commits it, with the job's completion, when the task returns",
                    },
                )
            run = self.run
            end = await on_ops(
                ops,
                complete_in_transaction(
                    ops,
                    self.lease,
                    run.owner,
                    result,
                    retention_s=self.settings.retention_seconds,
                    progress=progress,
                    until=time.monotonic() + max(self.settings.lease_seconds, MIN_COMMIT_S),
                ),
            )
        finally:
            await self.abandon()
        if end.kind == "committed":
            for submitted in self.staged:
                log_submitted(submitted)
        return end

    async def abandon(self, *, goes_on: bool = False) -> None:
        """End the session; a transaction still open is aborted with it (nothing of it
        remains). `goes_on`: the task carries on after its transaction block failed, so
        its job is handed back to heartbeats and progress. Idempotent."""
        ops = self.ops
        if ops is None:
            await self._end(goes_on=goes_on)
        else:
            await on_ops(ops, self._end(goes_on=goes_on))

    async def _end(self, *, goes_on: bool) -> None:
        """`abandon`, as a coroutine over the session's own ops (blocking ones never suspend)."""
        if self.state in ("none", "ended"):
            return
        self.state = "ended"
        ops = self.ops
        if ops is None:
            return
        with contextlib.suppress(PyMongoError):
            await ops.end()
        if goes_on and self._marked:
            with contextlib.suppress(PyMongoError):
                await end_transaction(ops, self.lease, self.run.owner, self.settings.lease_seconds)
        if goes_on and self._reporter is not None:
            self._reporter.release()
