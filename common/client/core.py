"""`ClientCore`: every operation a client offers, written once (async).

`brook.AsyncClient` is this core on its own `AsyncMongoClient`; `brook.Client` runs the same
coroutines on a private event-loop thread (`brook.common.runtime.blocking`); a task's
`ctx.submit` uses the core of its worker process; the HTTP API submits and retries through it
too. So every surface validates, checks task names, writes and logs the same way.

`submit` and `submit_many` take a `session=` (a caller's transaction): `Submitting` writes
them once for every client, and `BlockingSessions` runs that same code with a blocking
`ClientSession`, on the caller's thread (`brook.common.store.transactions`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import structlog
from pymongo import MongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import PyMongoError
from pymongo.synchronous.client_session import ClientSession
from pymongo.synchronous.database import Database

from brook.common.client.bulk import BulkOperations
from brook.common.client.dependents import recheck
from brook.common.client.output import OutputReading
from brook.common.client.quotas import QuotaOperations, quota_errors, quota_names
from brook.common.client.reruns import Reruns
from brook.common.client.spawned import cancel_spawned, cancel_with_spawned
from brook.common.client.task_directory import TaskDirectory
from brook.common.domain.deadlines import logged_bounds
from brook.common.domain.errors import (
    InvalidInput,
    JobConflict,
    JobNotFound,
    StepError,
    UnknownParent,
    WaitTimeout,
)
from brook.common.domain.models import DEFAULT_QUEUE, Doc, Job, JobSpec
from brook.common.domain.queues import validate_queue_update
from brook.common.domain.status import TERMINAL, JobStatus
from brook.common.domain.steps import check_signal_key, check_signal_payload
from brook.common.domain.validation import check_document, validate_batch, validate_spec
from brook.common.domain.workflows import external_parents, unknown_parents_detail
from brook.common.runtime import tracing
from brook.common.runtime.backoff import Backoff
from brook.common.runtime.log_events import Event, job_fields, log_event, requested_by
from brook.common.runtime.settings import WEEK_S
from brook.common.store.db import is_transient
from brook.common.store.jobs import JobStore, Submitted
from brook.common.store.queues import QueueStore, QueueUsage
from brook.common.store.quotas import QuotaStore, named_blocking
from brook.common.store.signals import SignalStore
from brook.common.store.transactions import (
    AsyncTxOps,
    SyncJobs,
    TxOps,
    TxSession,
    check_session,
    stage_jobs,
)

NO_TX_WORKFLOWS = "depends_on cannot be used with session= (submit the dependents after the commit)"
NO_TX_DEBOUNCE = "debounce_key cannot be used with session= (a debounced job joins outside it)"

# How long one wait on the job's change stream lasts on the server before the driver asks
# again (a `getMore`, not a read of the job).
WAIT_AWAIT_MS = 5000

_KEEP: Any = object()  # a limit `set_queue` was not asked to change

# The job whose task is submitting now, through `ctx.submit` (not `detach=True`): the task's
# context sets it around the call, and the submit records it as the new job's `spawned_by`.
# A context variable, so no public submit takes a parent, and it follows the call onto the
# worker's event loop (a plain `def` task's submit runs there).
spawning: ContextVar[str | None] = ContextVar("brook_spawning", default=None)

# `ClientCore.list` shadows the builtin in the class body: annotations there use these.
JobList = list[Job]
Submissions = list[Submitted]
SubmitOne = Callable[[JobSpec], Awaitable[Submitted]]
CountByQueue = Callable[[], Awaitable[dict[str, dict[str, int]]]]


@dataclass(frozen=True, kw_only=True)
class QueueInfo:
    """A queue as `GET /queues` shows it. `concurrency`, `rate` and `paused` are set by
    `PUT /queues/{name}` (cluster-wide limits); until then they are null and false.
    `slots_in_use`: jobs holding one of the queue's slots now (null for a queue without
    limits); `starts_in_window`: starts that count in the rate's current window."""

    name: str
    counts: dict[str, int]
    concurrency: int | None = None
    rate: dict[str, float] | None = None
    paused: bool = False
    slots_in_use: int | None = None
    starts_in_window: int | None = None
    key_concurrency: int | None = None
    key_rate: dict[str, float] | None = None
    fair: bool = False

    @classmethod
    def of(cls, name: str, counts: dict[str, int], usage: QueueUsage | None) -> QueueInfo:
        limits = usage.doc.limits if usage is not None else None
        if usage is None or limits is None or not limits.limited:
            return cls(name=name, counts=counts)
        return cls(
            name=name,
            counts=counts,
            concurrency=limits.concurrency,
            rate=limits.rate.to_api() if limits.rate else None,
            paused=limits.paused,
            slots_in_use=usage.in_use,
            starts_in_window=usage.in_window if limits.rate else None,
            key_concurrency=limits.key_concurrency,
            key_rate=limits.key_rate.to_api() if limits.key_rate else None,
            fair=limits.keyed,
        )

    def to_api(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "counts": self.counts,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "paused": self.paused,
            "slots_in_use": self.slots_in_use,
            "starts_in_window": self.starts_in_window,
            "key_concurrency": self.key_concurrency,
            "key_rate": self.key_rate,
            "fair": self.fair,
        }


def _seconds(value: object) -> object:
    return value.total_seconds() if isinstance(value, timedelta) else value


DURATIONS = ("delay", "start_within_s", "deadline_s")


def _from_python(spec: object) -> object:
    """The only liberty Python takes over JSON: a duration (`delay`, `start_within_s`,
    `deadline_s`) may be a `timedelta`. Anything else, a spec that is not a dict included,
    goes to the validator as it is."""
    if not isinstance(spec, Mapping):
        return spec
    durations = {k: _seconds(spec[k]) for k in DURATIONS if k in spec}
    return {**spec, **durations} if durations else spec


OnStaged = Callable[["TxSession", Sequence[Submitted]], None]


def _stamped(specs: Sequence[JobSpec]) -> list[JobSpec]:
    """`specs` carrying the current span's trace context (when tracing), so each job's run
    continues this trace."""
    carrier = tracing.inject()
    if carrier is None:
        return list(specs)
    return [s if s.trace is not None else replace(s, trace=carrier) for s in specs]


def _submit_span(specs: Sequence[JobSpec]) -> Any:
    """The submit's span (when tracing): the jobs' runs are its children."""
    tasks = sorted({s.task for s in specs})
    return tracing.span(
        f"brook.submit {tasks[0] if len(tasks) == 1 else 'batch'}",
        kind="PRODUCER",
        attributes={
            "brook.task": ",".join(tasks),
            "brook.queue": ",".join(sorted({s.queue for s in specs})),
            "brook.jobs": len(specs),
        },
    )


class Submitting:
    """`submit` and `submit_many`, written once for every kind of client. Without `session`,
    Brook's own majority writes store the jobs (`submit_spec`, `submit_specs`); with one,
    they are inserted inside the caller's transaction (`brook.common.store.transactions`) and exist
    only if it commits. Such jobs are not logged here (the caller commits, not Brook): a
    worker logs those of its task's transaction once it has committed them (`on_staged`)."""

    _directory: TaskDirectory
    on_staged: OnStaged | None = None

    async def submit(
        self,
        task: str,
        payload: Mapping[str, Any] | None = None,
        *,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        run_at: datetime | str | None = None,
        delay: float | timedelta | None = None,
        max_attempts: int = 3,
        timeout_s: float | None = None,
        idempotency_key: str | None = None,
        unique_for_s: float | None = None,
        retention_s: float | None = None,
        depends_on: Sequence[str] | None = None,
        run_on_parent_failure: bool = False,
        key: str | None = None,
        debounce_key: str | None = None,
        debounce_s: float | timedelta | None = None,
        debounce_max_s: float | timedelta | None = None,
        quotas: Mapping[str, int] | None = None,
        start_by: datetime | str | None = None,
        start_within_s: float | timedelta | None = None,
        deadline: datetime | str | None = None,
        deadline_s: float | timedelta | None = None,
        session: TxSession | None = None,
    ) -> Job:
        """Submit one job and return it (the existing job for a known `idempotency_key`): the
        HTTP spec's fields, a naive `run_at` read as UTC, a duration maybe a `timedelta`; bad
        input raises `InvalidInput` (the API's `422` detail). With `session`, the job is
        inserted in that transaction (on the client this one wraps), to exist if it commits."""
        fields = {
            "task": task,
            "payload": {} if payload is None else payload,
            "queue": queue,
            "priority": priority,
            "run_at": run_at,
            "delay": _seconds(delay),
            "max_attempts": max_attempts,
            "timeout_s": timeout_s,
            "idempotency_key": idempotency_key,
            "unique_for_s": unique_for_s,
            "retention_s": retention_s,
            "depends_on": None if depends_on is None else list(depends_on),
            "run_on_parent_failure": run_on_parent_failure,
            "key": key,
            "debounce_key": debounce_key,
            "debounce_s": _seconds(debounce_s),
            "debounce_max_s": _seconds(debounce_max_s),
            "quotas": None if quotas is None else dict(quotas),
            "start_by": start_by,
            "start_within_s": _seconds(start_within_s),
            "deadline": deadline,
            "deadline_s": _seconds(deadline_s),
        }
        return await self._submit_checked(validate_spec(fields), session)

    async def _submit_checked(self, spec: JobSpec, session: TxSession | None) -> Job:
        if (parent := spawning.get()) is not None:
            spec = replace(spec, spawned_by=parent)
        if session is not None:
            return (await self.submit_in(session, [spec], batch=False))[0].job
        return (await self.submit_spec(spec)).job

    async def submit_many(
        self, specs: Sequence[Mapping[str, Any]], *, session: TxSession | None = None
    ) -> JobList:
        """Submit up to 1,000 jobs, each a dict shaped like the HTTP spec, in one write; all
        or nothing (an `InvalidInput` names the bad spec's index), results in spec order.
        With `session`, inside that transaction, as `submit`."""
        batch = validate_batch({"jobs": [_from_python(s) for s in specs]})
        if session is not None:
            return [s.job for s in await self.submit_in(session, batch, batch=True)]
        return [s.job for s in await self.submit_specs(batch)]

    async def submit_in(
        self, session: TxSession, specs: Sequence[JobSpec], *, batch: bool
    ) -> Submissions:
        """Validated specs, inserted with the caller's session (refused unless it is in a
        transaction, on the client this one wraps); nothing is logged. Workflows are not
        staged in a transaction (their parents are marked and re-checked outside it)."""
        for i, spec in enumerate(specs):
            for field, given, msg in (
                ("depends_on", spec.depends_on, NO_TX_WORKFLOWS),
                ("debounce_key", spec.debounce_key, NO_TX_DEBOUNCE),
            ):
                if not given:
                    continue
                loc: list[object] = ["jobs", i, field] if batch else [field]
                raise InvalidInput(
                    [{"loc": loc, "msg": msg, "type": "unsupported_with_session"}]
                )
        ops = self._session_ops(session)
        await self._directory.check(specs, batch=batch)
        await self._check_quotas(specs, batch=batch)
        await self._ensure_indexes()
        with _submit_span(specs):
            staged = await stage_jobs(ops, _stamped(specs))
        if self.on_staged is not None:
            self.on_staged(session, staged)
        return staged

    async def submit_spec(self, spec: JobSpec) -> Submitted:
        raise NotImplementedError

    async def submit_specs(self, specs: Sequence[JobSpec]) -> Submissions:
        raise NotImplementedError

    def _session_ops(self, session: TxSession) -> TxOps:
        raise NotImplementedError

    async def _ensure_indexes(self) -> None:
        raise NotImplementedError

    async def _check_quotas(self, specs: Sequence[JobSpec], *, batch: bool) -> None:
        raise NotImplementedError


class ClientCore(QuotaOperations, Submitting, BulkOperations, Reruns, OutputReading):
    def __init__(
        self,
        store: JobStore,
        directory: TaskDirectory,
        *,
        submit_one: SubmitOne | None = None,
        count_by_queue: CountByQueue | None = None,
        on_staged: OnStaged | None = None,
        signal_retention_s: float = WEEK_S,
    ) -> None:
        self._store = store
        self._queues = QueueStore(store.db)
        self._quota_store = QuotaStore(store.db)
        self._signals = SignalStore(store.db)
        self.signal_retention_s = signal_retention_s
        self._directory = directory
        # The API passes its group commit here (concurrent submits share one write), and
        # its counts kept in memory (refreshed in the background) for `queues`.
        self._submit_one: SubmitOne = submit_one or store.submit
        self._count_by_queue: CountByQueue = count_by_queue or store.count_by_queue
        self._indexed: asyncio.Future[None] | None = None
        self.on_staged = on_staged

    async def _ensure_indexes(self) -> None:
        """Before this client's first write: the unique index that makes idempotency keys
        race-free must exist even if no API or dispatcher ever started (once per client)."""
        failed = (
            self._indexed is not None
            and self._indexed.done()
            and (self._indexed.cancelled() or self._indexed.exception() is not None)
        )
        if self._indexed is None or failed:
            self._indexed = asyncio.ensure_future(self._store.ensure_indexes())
        await asyncio.shield(self._indexed)

    def _session_ops(self, session: TxSession) -> TxOps:
        own = check_session(session, self._store.db.client, AsyncClientSession)
        return AsyncTxOps(self._store.jobs, own)

    # -- submit ------------------------------------------------------------------------------

    async def known_tasks(self) -> frozenset[str]:
        """The task names a submit may use now (the API's document lists them)."""
        return await self._directory.known()

    async def submit_spec(self, spec: JobSpec) -> Submitted:
        """A validated spec: check its task (and parents), insert it, log it."""
        if spec.depends_on:
            # Not through the API's group commit: its parents make it a workflow write.
            [submitted] = await self.submit_specs([spec], batch=False)
            return submitted
        await self._directory.check([spec], batch=False)
        await self._check_quotas([spec], batch=False)
        await self._ensure_indexes()
        with _submit_span([spec]) as current:
            # A debounced spec joins its key's job: one conditional upsert, not a group insert.
            stamped = _stamped([spec])[0]
            submit = self._store.submit if spec.debounce_key is not None else self._submit_one
            submitted = await submit(stamped)
            tracing.set_attribute(current, "brook.job.id", submitted.job.id)
        log_submitted(submitted)
        return submitted

    async def submit_specs(self, specs: Sequence[JobSpec], *, batch: bool = True) -> Submissions:
        """Validated specs, all or nothing: check every task and parent first, then one
        write. Jobs with parents that ended already are settled before this returns."""
        await self._directory.check(specs, batch=batch)
        await self._check_quotas(specs, batch=batch)
        missing = await self._store.missing_jobs(external_parents(specs))
        if missing:
            raise UnknownParent(unknown_parents_detail(specs, missing, batch=batch))
        await self._ensure_indexes()
        with _submit_span(specs) as current:
            out = await self._store.submit_many(_stamped(specs))
            if len(out) == 1:
                tracing.set_attribute(current, "brook.job.id", out[0].job.id)
        for submitted in out:
            log_submitted(submitted)
        if any(spec.depends_on for spec in specs):
            out = await recheck(self._store, out, via="submit")
        return out

    # -- read ----------------------------------------------------------------------------------

    async def get(self, job_id: str) -> Job:
        """The job; `JobNotFound` for an unknown id (or one deleted by retention)."""
        return await self._store.get(job_id)

    async def list(
        self,
        *,
        status: JobStatus | str | None = None,
        task: str | None = None,
        queue: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> JobList:
        """Jobs newest first; pass the last job's id as `after` for the next page."""
        jobs, _ = await self._store.list_jobs(
            status=None if status is None else JobStatus(status),
            task=task,
            queue=queue,
            limit=limit,
            after=after,
        )
        return jobs

    async def parent_results(self, job_id: str) -> dict[str, Any]:
        """`{parent id: result}` for the job's `depends_on`, in that order (`null` for a
        parent that did not complete; a parent deleted meanwhile is left out)."""
        return await self._store.parent_results(job_id)

    async def queues(self) -> Sequence[QueueInfo]:
        """Every queue that holds jobs or has limits, with its job counts by status (one
        aggregation, kept in memory by the API), its limits and the slots in use now
        (checked against the jobs)."""
        counts = await self._count_by_queue()
        usage = await self._queues.usage()
        empty = {s.value: 0 for s in JobStatus}
        return [
            QueueInfo.of(name, counts.get(name, dict(empty)), usage.get(name))
            for name in sorted(set(counts) | set(usage))
        ]

    async def set_queue(
        self,
        name: str,
        changes: object = None,
        *,
        concurrency: Any = _KEEP,
        rate: Any = _KEEP,
        paused: Any = _KEEP,
        key_concurrency: Any = _KEEP,
        key_rate: Any = _KEEP,
        fair: Any = _KEEP,
    ) -> QueueInfo:
        """Set a queue's cluster-wide limits, as a dict (the body of `PUT /queues/{name}`) or
        as keywords: `concurrency` (int or None), `rate` (`{"limit": int, "per_seconds":
        number}` or None), `paused` (bool), and per key (a job's `key`): `key_concurrency`
        (int or None), `key_rate` (as `rate`), `fair` (bool: claims take turns across keys;
        implied by a key limit); what is left out keeps its value. Invalid input
        (a body that is not a dict included) raises `InvalidInput`, the API's 422 detail,
        and changes nothing."""
        body: Any = changes if changes is not None else {}
        given = {
            "concurrency": concurrency,
            "rate": rate,
            "paused": paused,
            "key_concurrency": key_concurrency,
            "key_rate": key_rate,
            "fair": fair,
        }
        keywords = {k: v for k, v in given.items() if v is not _KEEP}
        if keywords and isinstance(body, Mapping):
            body = {**body, **keywords}
        fields = validate_queue_update(name, body)
        await self._ensure_indexes()  # counting the queue's running jobs reads one
        await self._queues.set_limits(name, fields)
        if structlog.is_configured():
            by = requested_by.get()
            log_event(Event.QUEUE_UPDATED, queue=name, by=by, **fields)
            if "paused" in fields:
                event = Event.QUEUE_PAUSED if fields["paused"] else Event.QUEUE_RESUMED
                log_event(event, queue=name, by=by)
        return next(q for q in await self.queues() if q.name == name)

    # -- change one job ------------------------------------------------------------------------

    async def cancel(self, job_id: str, *, dry_run: bool = False) -> Job:
        """A waiting or pending job is cancelled at once (and its dependents, which this
        settles); a running one is stopped by its dispatcher (`cancel_requested` until
        then). Every unfinished job it spawned (`ctx.submit`), and theirs, is cancelled too
        (`ParentCancelled`), also when the job itself had finished: the answer's
        `spawned_cancelled` counts them. `JobConflict` for a finished job that left none
        running. With `dry_run`, nothing changes: the job as it is, and the count."""
        if dry_run:
            return await self._cancel_dry_run(job_id)
        job, spawned = await cancel_with_spawned(self._store, job_id, via="cancel")
        if job is None:  # it had finished: an answer only if it still reached some
            job = await self._store.get(job_id)
            if not spawned:
                raise JobConflict(f"job {job_id} is already {job.status.value}")
        return replace(job, spawned_cancelled=spawned)

    async def _cancel_dry_run(self, job_id: str) -> Job:
        job = await self._store.get(job_id)
        spawned = await cancel_spawned(self._store, [job_id], via="cancel", dry_run=True)
        if job.status in TERMINAL and not spawned:
            raise JobConflict(f"job {job_id} is already {job.status.value}")
        return replace(job, spawned_cancelled=spawned)

    async def signal(self, key: str, payload: Any = None) -> int:
        """Send a signal on `key`: it is stored (majority-written, kept for the signal
        retention), then every job waiting on `key` is woken (due now; the dispatchers hear
        of it on their change stream). Returns how many were woken. A wait that starts later
        within the retention gets it at once. `InvalidInput` for a bad key or payload."""
        try:
            check_signal_key(key)
            check_document(payload)  # as a job's payload: no `$` key, no NUL, 64-bit ints
            check_signal_payload(payload)
        except (StepError, ValueError) as exc:
            raise InvalidInput(str(exc)) from None
        await self._ensure_indexes()  # the jobs waiting on a key are found by index
        await self._signals.put(key, payload, self.signal_retention_s)
        woken = await self._store.wake_signal_waiters(key)
        log_event(Event.SIGNAL_SENT, key=key, woken=woken, by=requested_by.get())
        return woken

    async def retry(self, job_id: str) -> Job:
        """A failed or cancelled job back to `pending` with its attempt budget renewed and its
        history kept; `JobConflict` for any other state. A job with parents that have not
        all completed goes back to `waiting` for them (and, if one of them failed, is
        cancelled again at once: retry that parent first)."""
        waiting_on = await self._parents_not_completed(job_id)
        if waiting_on:  # marked before and after, as for a submit (`JobStore.submit_many`)
            await self._store.attach_dependents(waiting_on)
        job = await self._store.retry(job_id, waiting_on)
        _emit(Event.JOB_RETRIED, job, max_attempts=job.max_attempts, status=job.status.value)
        if waiting_on:
            await self._store.attach_dependents(waiting_on)
            [again] = await recheck(self._store, [Submitted(job=job, created=False)], via="retry")
            job = again.job
        return job

    async def _parents_not_completed(self, job_id: str) -> Sequence[str]:
        # A completed job stays completed (only failed or cancelled ones can be retried),
        # so the parents found completed here need no waiting for.
        parents = (await self._store.get(job_id)).depends_on
        if not parents:
            return []
        completed = {p.job_id for p in await self._store.ended_parents(parents) if p.completed}
        return [p for p in parents if p not in completed]

    # -- wait ----------------------------------------------------------------------------------

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is completed, failed or cancelled and return it. It follows a
        change stream on that one job, never polling; `WaitTimeout` (a `TimeoutError`)
        after `timeout` seconds."""
        last: JobList = []
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await self._follow(job_id, last)
        except TimeoutError:
            if not deadline.expired():
                raise
            status = last[-1].status.value if last else "unknown"
            raise WaitTimeout(f"job {job_id} is still {status} after {timeout} s") from None

    async def _follow(self, job_id: str, last: JobList) -> Job:
        backoff = Backoff(0.1, 2.0)
        while True:
            try:
                # The job is read (a majority read: a snapshot a moment behind the newest
                # write), then followed from the cluster time of that read: a change after
                # the snapshot is delivered however soon it came. A stream opened first
                # starts at the newest write, and a completion between the two was in
                # neither (a wait that never ended, once, in CI).
                doc, read_at = await self._store.job_doc_now(job_id)
                if doc is None:
                    raise JobNotFound(job_id)
                last.append(Job.from_doc(doc))
                if last[-1].status in TERMINAL:
                    return last[-1]
                async with await self._store.job_changes(
                    job_id, max_await_ms=WAIT_AWAIT_MS, start_at=read_at
                ) as stream:
                    while last[-1].status not in TERMINAL:
                        change = await stream.next()
                        if change["operationType"] != "update":
                            raise JobNotFound(job_id)  # deleted, or the collection is gone
                        last.append(await self._store.get(job_id))
                    return last[-1]
            except PyMongoError as exc:
                if not is_transient(exc):
                    raise
                await asyncio.sleep(backoff.next())  # failover: open again, read again


class BlockingSessions(Submitting):
    """`submit` and `submit_many` with a blocking session (a `ClientSession` of an
    application's `MongoClient`, or of a plain `def` task's): the very code of the async
    session path, run on the caller's thread by `brook.common.runtime.blocking.drive`, every
    driver call blocking. Calls without a session never come here (`blocking_or_in_session`)."""

    def __init__(
        self,
        client: MongoClient[Doc],
        db: Database[Doc],
        local: Callable[[], Collection[str]],
        *,
        on_staged: OnStaged | None = None,
    ) -> None:
        self._client = client
        self._db = db
        self._jobs = SyncJobs(db)
        self._directory = TaskDirectory(self._jobs, local, open_while_none_live=True)
        self.on_staged = on_staged

    def _session_ops(self, session: TxSession) -> TxOps:
        return self._jobs.ops(check_session(session, self._client, ClientSession))

    async def _ensure_indexes(self) -> None:
        await self._jobs.ensure_indexes()

    async def _check_quotas(self, specs: Sequence[JobSpec], *, batch: bool) -> None:
        names = quota_names(specs)
        if names:
            errors = quota_errors(specs, named_blocking(self._db, names), batch=batch)
            if errors:
                raise InvalidInput(errors)


def _emit(event: Event, job: Job, **fields: Any) -> None:
    # Brook's own processes configure logging; a program using the client logs Brook's
    # events only if it configured structlog itself.
    if structlog.is_configured():
        log_event(event, **job_fields(job), by=requested_by.get(), **fields)


def log_submitted(submitted: Submitted) -> None:
    job = submitted.job
    if not submitted.created and job.debounce_key is not None:
        _emit(Event.JOB_DEBOUNCED, job, debounce_key=job.debounce_key, debounced=job.debounced)
        return
    if not submitted.created:
        _emit(Event.JOB_DEDUPLICATED, job, idempotency_key=job.idempotency_key)
        return
    _emit(
        Event.JOB_SUBMITTED,
        job,
        queue=job.queue,
        priority=job.priority,
        run_at=job.run_at.isoformat(),
        max_attempts=job.max_attempts,
        **_workflow(job),
        **logged_bounds(job),
    )


def _workflow(job: Job) -> dict[str, Any]:
    if not job.depends_on:
        return {}
    return {"status": job.status.value, "depends_on": job.depends_on}
