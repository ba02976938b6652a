"""Recording how an attempt ended: one fenced write per outcome, one verdict type for all.

Completions go by group commit (jobs that finish while a completion write is in flight
are written together in the next one: one `bulk_write`, one majority wait), each still
fenced by its own filter (`_id`, attempt, owner, running). Every other outcome (failure,
retry, timeout, crash, cancel, release) is one conditional write of its own. Every write
rides out a failover until a deadline; after it the job is left to lease expiry.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pymongo.errors import PyMongoError

from brook.common.domain.deadlines import Bound, Defaults, deadline_of, start_by_of
from brook.common.domain.errors import JobNotFound, LeaseLost
from brook.common.domain.models import Job
from brook.common.domain.status import JobStatus
from brook.common.protocol.runner import RELEASES, Outcome
from brook.common.runtime.backoff import Backoff, backoff_delay
from brook.common.runtime.group_commit import GroupCommit
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.runtime.metrics import JOB_DURATION, count_outcome
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import Spawn
from brook.common.store.failover_retry import ride_out
from brook.common.store.jobs import JobStore, Lease, RunTimes
from brook.dispatcher.attempts.dependents import Dependents
from brook.dispatcher.attempts.outcome_log import log_outcome, outcome_label
from brook.dispatcher.attempts.step_keeper import StepKeeper

VerdictKind = Literal["applied", "lost", "refused", "no_primary"]

# Under load (completions waiting when a write returns), the next completion write waits
# this long to carry more: a completion write is a replication round, which costs the set
# about the same for 5 jobs as for 50 (peer-harness drain: +15% at c = 2). A lone one is
# written at once.
COMPLETION_LINGER_S = 0.005

# An outcome write that found no primary before its deadline may still have applied: an
# earlier try of it can commit while a failover cuts its reply off. Up to this long after
# the deadline (a failover's election takes seconds to tens of seconds) the job is read
# back, a read being safe past the lease, so that the job's log says what became of it.
LEARN_AFTER_DEADLINE_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What became of an outcome write: `applied` (with the job as written), `lost` (another
    attempt or owner holds the job), `refused` (MongoDB rejected the write itself, with its
    reason) or `no_primary` (none before the write's deadline; the watchdog requeues the job)."""

    kind: VerdictKind
    job: Job | None = None
    detail: str = ""


class Outcomes:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        owner: str,
        spawn: Spawn,
        dependents: Dependents,
        steps: StepKeeper | None = None,
        bounds: Defaults | None = None,
    ) -> None:
        """`bounds`: the tasks' default deadlines (`Wiring.bounds`)."""
        self.settings = settings
        self.bounds: Defaults = bounds or {}
        # Told of each job an outcome sent back to wait (a retry, a sleep, a hand-back): the
        # deadline timer's (`DeadlineTimer.heard`).
        self.waits: Callable[[Job], None] = lambda job: None
        self.steps = steps
        self.store = store
        self.owner = owner
        self.dependents = dependents
        self._cutoff = math.inf
        self._completions: GroupCommit[tuple[Lease, Any, RunTimes | None], Verdict] = GroupCommit(
            self._complete_many, spawn=spawn, linger_s=COMPLETION_LINGER_S
        )
        # A stopping dispatcher's hand-backs, together: one round trip for hundreds.
        self._releases: GroupCommit[Lease, Job | None] = GroupCommit(
            self._release_many, spawn=spawn
        )

    def cut_off(self, at: float) -> None:
        """No write retries past the monotonic time `at` (shutdown's hard deadline)."""
        self._cutoff = at

    def _until(self) -> float:
        return min(time.monotonic() + self.settings.lease_seconds * 2, self._cutoff)

    async def record(
        self,
        job: Job,
        lease: Lease,
        outcome: Outcome,
        elapsed: float,
        *,
        ran: RunTimes | None = None,
    ) -> Verdict:
        """Write the outcome of one attempt and log the job's new state. `ran`: when its task
        really started and ended (None for a job stopped before its task started)."""
        fields = job_fields(job) | {"duration_ms": round(elapsed * 1000, 2)}
        JOB_DURATION.labels(task=job.task).observe(elapsed)
        if self.steps is not None:
            self.steps.count(job, outcome.steps_replayed, outcome.steps_committed)
        if outcome.committed:
            return self._committed(job, fields)
        if outcome.tx_session is not None:
            await self._end_transaction(outcome.tx_session, fields)
        if outcome.kind == "lease_lost":
            if await self._completed_by(lease):
                return self._committed(job, fields)
            log_event(Event.JOB_RESULT_DISCARDED, level="warning", **fields, reason="lease lost")
            return Verdict(kind="lost")
        if outcome.kind == "timeout":
            log_event(Event.JOB_TIMED_OUT, level="warning", **fields, timeout_s=job.timeout_s)
        if outcome.kind == "ok":
            verdict = await self._completions.submit((lease, outcome.result, ran))
        else:
            verdict = await self._write(job, lease, outcome, ran)
        if verdict.kind == "refused":
            log_event(
                Event.MONGO_REFUSED,
                level="error",
                op="record",
                error=verdict.detail[:300],
                **fields,
            )
            verdict = await self._fail_refused(job, lease, verdict.detail, ran)
            outcome = Outcome(kind="error")
        if verdict.kind == "lost" and await self._completed_by(lease):
            return self._committed(job, fields)
        if verdict.kind == "no_primary":
            verdict = await self._learn(lease, outcome, verdict)
        log_outcome(verdict, outcome, fields)
        count_outcome(job, outcome_label(verdict, outcome))
        if verdict.job is not None:
            self._written(verdict.job)
        return verdict

    def _written(self, job: Job) -> None:
        """An outcome's write landed: settle the job's dependents if it ended, tell the
        deadline timer if it waits again."""
        if job.has_dependents:
            self._parent_ended(job)
        if job.status == JobStatus.PENDING:
            self.waits(job)

    def _parent_ended(self, job: Job) -> None:
        if job.status == JobStatus.FAILED:
            self.dependents.parents_ended([job.id], "failure")
        elif job.status == JobStatus.CANCELLED:
            self.dependents.parents_ended([job.id], "cancel")

    # -- attempts that completed in their own transaction (`ctx.transaction()`) ------------------

    def _committed(self, job: Job, fields: dict[str, Any]) -> Verdict:
        """The task's own transaction wrote the completion (fenced by attempt and owner)
        together with its writes: there is nothing left to write, only to log."""
        log_event(Event.JOB_COMPLETED, **fields, transaction=True)
        count_outcome(job, "completed")
        # That write was not fenced on the job having no dependents (`complete_many`), so
        # whether a child was attached since the claim is not known here: settle anyway
        # (one read, for a job that has none).
        self.dependents.parents_ended([job.id], "completion")
        return Verdict(kind="applied")

    async def _completed_by(self, lease: Lease) -> bool:
        """A write found the job no longer ours: did this very attempt complete it, in its
        own transaction, before its worker could say so (it died, was killed, or could not
        learn its commit's outcome)? Decided by what committed, read, never guessed."""
        try:
            done = await ride_out(
                "completed_by", lambda: self.store.completed_by(lease), until=self._until()
            )
        except PyMongoError:
            return False
        return bool(done)

    async def _end_transaction(self, session_id: dict[str, Any], fields: dict[str, Any]) -> None:
        """The attempt's worker may have left its transaction open (it died, was killed, or
        its commit's outcome is unknown): end that server session first, so that nothing of
        it can commit after the write that follows, and its locks go now rather than at the
        server's transaction lifetime limit. Best effort: that limit ends it anyway."""
        try:
            await ride_out(
                "end_transaction",
                lambda: self.store.kill_sessions([session_id]),
                until=self._until(),
            )
        except PyMongoError as exc:
            log_event(
                Event.MONGO_REFUSED, level="warning", op="end_transaction", error=str(exc)[:300]
            )
            return
        log_event(Event.TRANSACTION_ENDED, **fields)

    async def _write(
        self, job: Job, lease: Lease, outcome: Outcome, ran: RunTimes | None
    ) -> Verdict:
        try:
            done = await ride_out(
                "record", lambda: self._write_other(job, lease, outcome, ran), until=self._until()
            )
        except LeaseLost:
            return await self._lost_or_ours(lease)
        except PyMongoError as exc:  # not transient: retrying would fail the same way
            return Verdict(kind="refused", detail=str(exc))
        return Verdict(kind="no_primary") if done is None else Verdict(kind="applied", job=done)

    async def _learn(self, lease: Lease, outcome: Outcome, verdict: Verdict) -> Verdict:
        """No primary took the outcome's write before its deadline, but an earlier try of it
        may have applied, its reply lost to the failover: read what the job says once a
        primary answers (bounded, and never past shutdown's cut-off). While it still shows
        this attempt running, its fate is not known yet (a new primary's majority view may
        not show the write yet, or nobody has ended the attempt): read again, until the
        write shows, or the watchdog has requeued the job at lease expiry. Applied by this
        attempt: the write's verdict; else, or still unknown: `no_primary`."""
        until = min(
            time.monotonic() + max(LEARN_AFTER_DEADLINE_S, self.settings.lease_seconds * 6),
            self._cutoff,
        )
        backoff = Backoff(0.2, 2.0)
        try:
            while await self._still_running(lease, until):
                await asyncio.sleep(min(backoff.next(), max(until - time.monotonic(), 0.0)))
                if time.monotonic() >= until:
                    return verdict
            if outcome.kind == "ok":
                completed = await ride_out(
                    "completed_by", lambda: self.store.completed_by(lease), until=until
                )
                return Verdict(kind="applied") if completed else verdict
            job = await ride_out(
                "ended_by_holder", lambda: self.store.ended_by_holder(lease), until=until
            )
        except (PyMongoError, JobNotFound):
            return verdict
        if job is None or job.status == JobStatus.COMPLETED:
            return verdict
        return Verdict(kind="applied", job=job)

    async def _still_running(self, lease: Lease, until: float) -> bool:
        """Whether the job still shows this attempt running here (None: no answer in time
        counts as not known, so as running)."""
        job = await ride_out("outcome_of", lambda: self.store.get(lease.job_id), until=until)
        if job is None:
            return time.monotonic() < until
        return (job.status, job.attempts, job.owner) == (
            JobStatus.RUNNING,
            lease.attempt,
            self.owner,
        )

    async def _lost_or_ours(self, lease: Lease) -> Verdict:
        """The write found the attempt no longer ours: lost, unless an earlier try of it
        applied (its reply lost to a failover), which the job's history tells. (An attempt
        its holder completed was completed by the task's own transaction: not this write,
        and `record` tells that one apart.)"""
        try:
            job = await ride_out(
                "ended_by_holder", lambda: self.store.ended_by_holder(lease), until=self._until()
            )
        except PyMongoError:
            job = None
        if job is None or job.status == JobStatus.COMPLETED:
            return Verdict(kind="lost")
        return Verdict(kind="applied", job=job)

    async def _write_other(
        self, job: Job, lease: Lease, outcome: Outcome, ran: RunTimes | None
    ) -> Job:
        if outcome.kind == "cancelled":
            return await self.store.cancel_running(lease, self.owner, ran=ran)
        if outcome.kind in ("start_by_passed", "deadline_exceeded"):
            return await self._past_bound(job, lease, outcome, ran)
        if outcome.kind == "suspended" and outcome.suspend is not None and self.steps is not None:
            return await self.steps.suspend(job, lease, outcome.suspend)
        if outcome.kind in RELEASES:
            released = await self._releases.submit(lease)
            if released is None:
                raise LeaseLost(f"job {lease.job_id} attempt {lease.attempt} is no longer held")
            return released
        delay = outcome.retry_delay
        if delay is None:
            delay = self._backoff(job)
        error = outcome.error or {"type": "Error", "message": outcome.kind}
        return await self.store.fail_attempt(lease, self.owner, error, max(delay, 0.0), ran=ran)

    async def _past_bound(
        self, job: Job, lease: Lease, outcome: Outcome, ran: RunTimes | None
    ) -> Job:
        """A held job stopped at its `start_by` (never started) or its `deadline`."""
        bound: Bound = "deadline_exceeded"
        at = deadline_of(job, self.bounds)
        if outcome.kind == "start_by_passed":
            bound, at = "start_by_passed", start_by_of(job, self.bounds)
        when = at or datetime.now(UTC)
        return await self.store.end_held_past_bound(lease, self.owner, bound, when, ran)

    async def _release_many(self, leases: Sequence[Lease]) -> list[Job | None]:
        released = await self.store.release_many(self.owner, leases)
        return [released.get(lease.job_id) for lease in leases]

    async def _complete_many(
        self, items: Sequence[tuple[Lease, Any, RunTimes | None]]
    ) -> list[Verdict]:
        results = [(lease, result) for lease, result, _ in items]
        ran = {lease.job_id: times for lease, _, times in items if times is not None}
        try:
            written = await ride_out(
                "complete",
                lambda: self.store.complete_many(self.owner, results, ran=ran),
                until=self._until(),
            )
        except PyMongoError as exc:  # not transient
            return [Verdict(kind="refused", detail=str(exc))] * len(items)
        if written is None:
            return [Verdict(kind="no_primary")] * len(items)
        # After the completions are written: a dispatcher that dies before this leaves
        # their dependents to the sweep.
        self.dependents.parents_ended(written.parents, "completion")
        done, refused = written.done, written.refused
        verdicts: list[Verdict] = []
        for lease, _, _ in items:
            if lease.job_id in done:
                verdicts.append(Verdict(kind="applied"))
            elif lease.job_id in refused:
                verdicts.append(Verdict(kind="refused", detail=refused[lease.job_id]))
            else:
                verdicts.append(Verdict(kind="lost"))
        return verdicts

    async def _fail_refused(
        self, job: Job, lease: Lease, message: str, ran: RunTimes | None
    ) -> Verdict:
        """MongoDB refused the outcome itself (e.g. a result over the document size limit):
        fail the attempt with that error rather than leave the job to lease expiry."""
        error = {"type": "ResultNotStored", "message": message[:2000]}
        backoff = self._backoff(job)
        try:
            done = await self.store.fail_attempt(lease, self.owner, error, backoff, ran=ran)
        except LeaseLost:
            return Verdict(kind="lost")
        except PyMongoError as exc:
            return Verdict(kind="no_primary", detail=str(exc))
        return Verdict(kind="applied", job=done)

    def _backoff(self, job: Job) -> float:
        s = self.settings
        return backoff_delay(job.attempts, s.retry_base_seconds, s.retry_cap_seconds)
