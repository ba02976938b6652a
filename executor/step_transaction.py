"""A transactional step (`ctx.step(name, fn, transactional=True)`): `fn(session)`'s writes
and the step's checkpoint commit in one MongoDB transaction.

As for `ctx.transaction()` (`executor.transaction`): a fenced write outside the transaction
first renews the lease for its length and records its session (nothing else writes the job
meanwhile, so the checkpoint write inside cannot meet a write conflict, and whoever requeues
an abandoned attempt ends the session first); then the transaction starts, `fn` writes
through its session, the checkpoint is written in it fenced by attempt and owner, and the
two commit together (`brook.common.store.transactions.step_in_transaction`). A lost lease, an
exception, a failover that aborts the commit or a dead worker leaves neither. Afterwards the
job is handed back to heartbeats and progress. The same code runs on an async session (an
`async def` task) and on a blocking one (a plain `def` task's thread, driven by `drive`).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable
from typing import Any

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import PyMongoError
from pymongo.synchronous.client_session import ClientSession

from brook.common.domain.errors import LeaseLost, StepError
from brook.common.domain.steps import check_steps_total, encode_step_result
from brook.common.protocol.runner import RunJob, TxOpened
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import Lease
from brook.common.store.transactions import (
    TASK_TRANSACTION,
    TxEnd,
    begin_transaction,
    end_transaction,
    step_in_transaction,
    task_ops,
)
from brook.executor.progress import ProgressReporter
from brook.executor.steps import Journal
from brook.executor.transaction import MIN_COMMIT_S


async def transactional_step(
    session: AsyncClientSession | ClientSession,
    journal: Journal,
    name: str,
    call: Callable[[Any], Any],
    *,
    settings: Settings,
    send: Callable[[Any], None] | None,
    reporter: ProgressReporter | None,
) -> Any:
    """Run `call(session)` in a new transaction on `session` and commit its writes with the
    step's checkpoint; return the result as stored. Ends the session."""
    run: RunJob = journal.run
    if not run.owner:
        raise RuntimeError("a transactional step needs a running attempt of a Brook worker")
    lease = Lease(job_id=run.job_id, attempt=run.attempt)
    ops = task_ops(session, settings)
    lease_s = settings.lease_seconds
    started = time.monotonic()
    try:
        if not await begin_transaction(ops, lease, run.owner, session.session_id, lease_s):
            raise LeaseLost(f"step {name!r}: the lease was lost before its transaction began")
        if reporter is not None:
            reporter.hold()
        if send is not None:
            lsid = dict(session.session_id)
            send(TxOpened(job_id=run.job_id, attempt=run.attempt, session_id=lsid))
        begun = session.start_transaction(**TASK_TRANSACTION)
        if inspect.isawaitable(begun):
            await begun
        value = call(session)
        if inspect.isawaitable(value):
            value = await value
        stored, size = encode_step_result(name, value)
        check_steps_total(name, journal.total + size)
        duration_ms = (time.monotonic() - started) * 1000
        end = await step_in_transaction(
            ops,
            lease,
            run.owner,
            (name, stored, size, duration_ms),
            until=time.monotonic() + max(lease_s, MIN_COMMIT_S),
        )
        _raise_unless_committed(end, name, run)
        journal.note_recorded(name, stored, size)
        journal.committed += 1
        return stored
    finally:
        with contextlib.suppress(PyMongoError):
            await ops.abort()
        with contextlib.suppress(PyMongoError):
            await ops.end()
        with contextlib.suppress(PyMongoError):
            await end_transaction(ops, lease, run.owner, lease_s)
        if reporter is not None:
            reporter.release()


def _raise_unless_committed(end: TxEnd, name: str, run: RunJob) -> None:
    """A step's transaction that did not commit fails the step: the lease was lost (the
    transaction was aborted), or its commit failed or is unknown."""
    if end.kind == "lost":
        raise LeaseLost(
            f"step {name!r}: job {run.job_id} attempt {run.attempt} lost its lease; its "
            "transaction was aborted"
        )
    if end.kind != "committed":
        detail = (end.error or {}).get("message", end.kind)
        raise StepError(f"step {name!r}: its transaction did not commit ({detail})")
