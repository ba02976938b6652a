"""Brook's writes inside a MongoDB transaction: jobs enqueued with the caller's session, and
a task's completion committed together with the task's own writes (`ctx.transaction()`).

The logic is written once, as coroutines over `TxOps`, the few driver calls it makes with
one session: `AsyncTxOps` runs them on an `AsyncClientSession`, `SyncTxOps` on a blocking
`ClientSession` (an application's `MongoClient`, or a plain `def` task's). A blocking
session's calls block and belong to its caller's thread, so `SyncTxOps`' coroutines never
suspend and `brook.common.runtime.blocking.drive` runs them to the end right there, without a loop.
Documents and filters come from `brook.common.store.queries`, the one home of Brook's queries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from bson import ObjectId
from pymongo import ReadPreference, UpdateOne
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure, PyMongoError
from pymongo.read_concern import ReadConcern
from pymongo.synchronous.client_session import ClientSession
from pymongo.synchronous.collection import Collection
from pymongo.synchronous.database import Database

from brook.common.domain.errors import InvalidSession
from brook.common.domain.models import Doc, Job, JobSpec
from brook.common.runtime.backoff import Backoff
from brook.common.runtime.blocking import drive
from brook.common.runtime.settings import Settings
from brook.common.store import queries
from brook.common.store.db import MAJORITY, database, is_transient, sync_database
from brook.common.store.jobs.base import JOBS
from brook.common.store.jobs.indexes import INDEXES
from brook.common.store.presence import DISPATCHERS, LiveDispatcher, live_filter
from brook.common.store.queries import Update, new_job_upsert
from brook.common.store.records import Lease, Submitted

T = TypeVar("T")
S = TypeVar("S")

# A task's transaction (`ctx.transaction()`): reads from one snapshot, commits to a majority.
TASK_TRANSACTION: dict[str, Any] = {
    "read_concern": ReadConcern("snapshot"),
    "write_concern": MAJORITY,
    "read_preference": ReadPreference.PRIMARY,
}

MAX_TIME_EXPIRED = 50  # the server's MaxTimeMSExpired: a commit it will not retry


class TxSession(Protocol):
    """What Brook asks of a caller's session, async or blocking."""

    @property
    def client(self) -> Any: ...

    @property
    def in_transaction(self) -> bool: ...


def check_session(session: object, client: object, kind: type[S]) -> S:
    """`session` as a `kind` of `client` inside a transaction, or `InvalidSession` saying why."""
    if not isinstance(session, kind):
        raise InvalidSession(
            f"session must be a pymongo {kind.__name__} (from this client's MongoClient), "
            f"not {type(session).__name__}"
        )
    if getattr(session, "client", None) is not client:
        raise InvalidSession(
            "session belongs to another MongoClient (session.client is not the client this "
            "Brook client wraps): start it from the client passed as mongo_client="
        )
    if not getattr(session, "in_transaction", False):
        raise InvalidSession(
            "session is not in a transaction (session.in_transaction is False): submit "
            "inside session.start_transaction() or session.with_transaction(...)"
        )
    return session


# -- the driver calls, with one session --------------------------------------------------------


class TxOps(Protocol):
    """The driver calls the transactional logic makes, each with the one session."""

    blocking: bool

    async def find(self, query: Mapping[str, Any]) -> list[Doc]: ...

    async def update_one(self, query: Mapping[str, Any], pipeline: Update) -> int: ...

    async def update_outside(self, query: Mapping[str, Any], pipeline: Update) -> int:
        """An update through the session's client but outside the transaction (majority)."""

    async def upsert_many(self, requests: list[UpdateOne]) -> None: ...

    async def commit(self) -> None: ...

    async def abort(self) -> None: ...

    async def pause(self, seconds: float) -> None: ...

    async def end(self) -> None:
        """End the session (a transaction still open is aborted with it)."""


class AsyncTxOps:
    blocking = False

    def __init__(self, jobs: AsyncCollection[Doc], session: AsyncClientSession) -> None:
        self.jobs = jobs
        self.session = session

    async def find(self, query: Mapping[str, Any]) -> list[Doc]:
        return await self.jobs.find(query, session=self.session).to_list()

    async def update_one(self, query: Mapping[str, Any], pipeline: Update) -> int:
        return (await self.jobs.update_one(query, pipeline, session=self.session)).matched_count

    async def update_outside(self, query: Mapping[str, Any], pipeline: Update) -> int:
        return (await self.jobs.update_one(query, pipeline)).matched_count

    async def upsert_many(self, requests: list[UpdateOne]) -> None:
        await self.jobs.bulk_write(requests, ordered=True, session=self.session)

    async def commit(self) -> None:
        await self.session.commit_transaction()

    async def abort(self) -> None:
        if self.session.in_transaction:
            await self.session.abort_transaction()

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def end(self) -> None:
        _retire(self.session)
        await self.session.end_session()


class SyncTxOps:
    """The same calls on a blocking session: coroutines that block and never suspend."""

    blocking = True

    def __init__(self, jobs: Collection[Doc], session: ClientSession) -> None:
        self.jobs = jobs
        self.session = session

    async def find(self, query: Mapping[str, Any]) -> list[Doc]:
        return self.jobs.find(query, session=self.session).to_list()

    async def update_one(self, query: Mapping[str, Any], pipeline: Update) -> int:
        return self.jobs.update_one(query, pipeline, session=self.session).matched_count

    async def update_outside(self, query: Mapping[str, Any], pipeline: Update) -> int:
        return self.jobs.update_one(query, pipeline).matched_count

    async def upsert_many(self, requests: list[UpdateOne]) -> None:
        self.jobs.bulk_write(requests, ordered=True, session=self.session)

    async def commit(self) -> None:
        self.session.commit_transaction()

    async def abort(self) -> None:
        if self.session.in_transaction:
            self.session.abort_transaction()

    async def pause(self, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - a blocking session: this never suspends

    async def end(self) -> None:
        _retire(self.session)
        self.session.end_session()


def task_ops(session: AsyncClientSession | ClientSession, settings: Settings) -> TxOps:
    """The ops of a task's transaction: Brook's jobs collection, through the session's
    own client (the worker process's)."""
    if isinstance(session, AsyncClientSession):
        return AsyncTxOps(database(session.client, settings)[JOBS], session)
    return SyncTxOps(sync_database(session.client, settings)[JOBS], session)


def _retire(session: AsyncClientSession | ClientSession) -> None:
    """Keep this server session out of the driver's pool when it ends: its id was published
    (`TxOpened`, `tx_session`) so that an abandoned attempt's transaction can be killed, and
    a later kill must never reach another attempt's transaction on a reused id. (pymongo's
    own way to drop a session after a network error; ids are free, the server forgets the
    old one.)"""
    server_session = getattr(session, "_server_session", None)
    mark_dirty = getattr(server_session, "mark_dirty", None)
    if callable(mark_dirty):
        mark_dirty()


async def on_ops(ops: TxOps, coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` over `ops` from async code: blocking ops on a worker thread, so the
    event loop stays free."""
    if ops.blocking:
        return await asyncio.to_thread(drive, coro)
    return await coro


class SyncJobs:
    """What a submit with a blocking session needs besides the session — the live
    dispatchers' tasks (the task-name check) and the jobs' indexes — on that blocking
    client, as coroutines that never suspend (`drive`)."""

    def __init__(self, db: Database[Doc]) -> None:
        self.db = db
        self.jobs: Collection[Doc] = db[JOBS]
        self._indexed = False

    def ops(self, session: ClientSession) -> SyncTxOps:
        return SyncTxOps(self.jobs, session)

    async def live_dispatchers(self) -> list[LiveDispatcher]:
        return [LiveDispatcher.from_doc(d) for d in self.db[DISPATCHERS].find(live_filter())]

    async def ensure_indexes(self) -> None:
        """Once per client. A conflicting older spec is left to Brook's own processes, which
        rebuild it (`JobStore.ensure_indexes`)."""
        if self._indexed:
            return
        try:
            self.jobs.create_indexes(INDEXES)
        except OperationFailure as exc:
            if exc.code not in (85, 86):  # IndexOptionsConflict, IndexKeySpecsConflict
                raise
        self._indexed = True


# -- enqueue inside the caller's transaction ---------------------------------------------------


async def stage_jobs(ops: TxOps, specs: Sequence[JobSpec]) -> list[Submitted]:
    """Insert these jobs with the caller's session: they exist only if its transaction
    commits (the change stream sees them at the commit, not before).

    Idempotency keys behave as outside a transaction: a key held by a job the transaction
    sees returns that job, and a key whose unique window is over is released (in this same
    transaction) for a new job. A key a concurrent writer takes after this transaction's
    snapshot is a write conflict: MongoDB aborts the transaction with a
    `TransientTransactionError`, and running it again (`with_transaction` does) returns
    that writer's job.
    """
    keys = sorted({s.idempotency_key for s in specs if s.idempotency_key is not None})
    held: dict[str, Job] = {}
    if keys:
        for doc in await ops.find({"idempotency_key": {"$in": keys}}):
            key = doc["idempotency_key"]
            released = queries.key_released(doc["_id"], key)
            if doc.get("unique_until") is not None and await ops.update_one(
                released.filter, released.update
            ):
                continue
            held[key] = Job.from_doc(doc)
    plan: list[tuple[str, bool]] = []  # per spec: the job's id, and whether it is new
    new: dict[str, JobSpec] = {}
    first: dict[str, str] = {}  # a key repeated within the batch: its first job
    for spec in specs:
        key = spec.idempotency_key
        if key is not None and key in held:
            plan.append((held[key].id, False))
        elif key is not None and key in first:
            plan.append((first[key], False))
        else:
            job_id = str(ObjectId())
            new[job_id] = spec
            plan.append((job_id, True))
            if key is not None:
                first[key] = job_id
    jobs = {job.id: job for job in held.values()}
    if new:
        try:
            await ops.upsert_many([new_job_upsert(job_id, spec) for job_id, spec in new.items()])
        except BulkWriteError as exc:
            raise _key_taken(exc) from exc
        for doc in await ops.find({"_id": {"$in": list(new)}}):
            jobs[doc["_id"]] = Job.from_doc(doc)
    return [Submitted(job=jobs[job_id], created=created) for job_id, created in plan]


def _key_taken(exc: BulkWriteError) -> PyMongoError:
    """A duplicate key inside a transaction aborts it (MongoDB's rule). The key was taken
    after the snapshot the check read (committed but not yet majority-visible, say); the
    transaction can simply run again, and then returns the job holding the key: say so with
    the label drivers retry on."""
    errors = exc.details.get("writeErrors", [])
    if not errors or any(err.get("code") != 11000 for err in errors):
        return exc
    message = (
        "an idempotency key was taken by a concurrent submit after this transaction's "
        "snapshot, and MongoDB aborted the transaction: run it again (with_transaction "
        "does) and the submit returns the job holding the key"
    )
    return DuplicateKeyError(
        message,
        11000,
        {"errmsg": message, "code": 11000, "errorLabels": ["TransientTransactionError"]},
    )


# -- complete inside the task's transaction ----------------------------------------------------

TxEndKind = Literal["committed", "lost", "aborted", "refused", "unknown"]


@dataclass(frozen=True, kw_only=True)
class TxEnd:
    """What became of an attempt's transaction: `committed` (the completion and the task's
    writes), `lost` (the lease was lost: aborted, nothing of it remains), `aborted` (MongoDB
    aborted it, e.g. a failover: nothing remains; the attempt failed), `refused` (MongoDB
    refused the completion itself, e.g. too large: aborted) or `unknown` (the commit's
    outcome could not be learnt in time: whoever writes the job next decides, fenced)."""

    kind: TxEndKind
    error: dict[str, Any] | None = None


async def begin_transaction(
    ops: TxOps, lease: Lease, owner: str, session_id: Mapping[str, Any], lease_seconds: float
) -> bool:
    """Before a task's transaction starts (its snapshot must come after this): the fenced
    write that renews the lease for the whole transaction and records its session
    (`brook.common.store.queries.transaction_opened`). False: the lease is already lost."""
    opened = queries.transaction_opened(lease, owner, session_id, lease_seconds)
    return await ops.update_outside(opened.filter, opened.update) == 1


async def end_transaction(ops: TxOps, lease: Lease, owner: str, lease_seconds: float) -> None:
    """The task's transaction was aborted and the task goes on: heartbeats renew it again."""
    closed = queries.transaction_closed(lease, owner, lease_seconds)
    await ops.update_outside(closed.filter, closed.update)


async def complete_in_transaction(
    ops: TxOps,
    lease: Lease,
    owner: str,
    result: Any,
    *,
    retention_s: float,
    progress: Mapping[str, Any] | None,
    until: float,
) -> TxEnd:
    """Write the attempt's completion in its own transaction, fenced by attempt and owner,
    and commit the two together. A fence that matches nothing (the lease was lost) aborts:
    the attempt's writes vanish with its result."""
    try:
        completed = queries.completed_in_transaction(lease, owner, result, retention_s, progress)
        matched = await ops.update_one(completed.filter, completed.update)
    except PyMongoError as exc:
        await ops.abort()
        if is_transient(exc):
            return TxEnd(kind="aborted", error=_error("TransactionAborted", exc))
        return TxEnd(kind="refused", error=_error("ResultNotStored", exc))
    if not matched:
        await ops.abort()
        return TxEnd(kind="lost")
    return await commit(ops, until=until)


async def commit(ops: TxOps, *, until: float) -> TxEnd:
    """Commit, retrying an `UnknownTransactionCommitResult` as the driver's specification
    prescribes (`commitTransaction` may be retried: the server answers what became of the
    transaction) until the monotonic time `until`."""
    backoff = Backoff(0.05, 1.0)
    while True:
        try:
            await ops.commit()
            return TxEnd(kind="committed")
        except PyMongoError as exc:
            unknown = exc.has_error_label("UnknownTransactionCommitResult")
            if unknown and _retryable_commit(exc) and time.monotonic() < until:
                await ops.pause(backoff.next())
                continue
            if not unknown and exc.has_error_label("TransientTransactionError"):
                return TxEnd(kind="aborted", error=_error("TransactionAborted", exc))
            return TxEnd(kind="unknown", error=_error("TransactionCommitUnknown", exc))


def _retryable_commit(exc: PyMongoError) -> bool:
    return not (isinstance(exc, OperationFailure) and exc.code == MAX_TIME_EXPIRED)


def _error(kind: str, exc: BaseException) -> dict[str, Any]:
    return {"type": kind, "message": f"{type(exc).__name__}: {exc}"[:2000]}


# -- a transactional step: its function's writes and its checkpoint, committed together ------


async def step_in_transaction(
    ops: TxOps,
    lease: Lease,
    owner: str,
    step: tuple[str, Any, int, float],
    *,
    until: float,
) -> TxEnd:
    """Write a step's checkpoint (`step`: name, result, size, duration in ms) in the step's
    own transaction, fenced by attempt and owner, and commit it with the writes the step's
    function made there: both or neither. A fence that matches nothing (the lease was
    lost) aborts."""
    name, result, size, duration_ms = step
    try:
        recorded = queries.step_recorded_in_transaction(
            lease, owner, name, result, size, duration_ms
        )
        matched = await ops.update_one(recorded.filter, recorded.update)
    except PyMongoError as exc:
        await ops.abort()
        if is_transient(exc):
            return TxEnd(kind="aborted", error=_error("TransactionAborted", exc))
        return TxEnd(kind="refused", error=_error("StepNotStored", exc))
    if not matched:
        await ops.abort()
        return TxEnd(kind="lost")
    return await commit(ops, until=until)
