"""DeadlineTimer: waiting and pending jobs ended at their `start_by` or `deadline`.

A job that waits for its parents, its due time, a retry, a durable sleep's wake-up or a
signal is held by no dispatcher, so every dispatcher keeps one timer for the earliest bound
of any such job (its own, or its task's default that this dispatcher knows) and, when it
comes, ends each job whose bound passed: one fenced write each, on the server's clock, so
that of several dispatchers one ends it. The timer learns of earlier bounds from new jobs
(the stream) and from the jobs its own attempts sent back to wait (`heard`); the sweep
looks again (`look`), for what no event announced. Not at the next sweep: at the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from datetime import UTC, datetime

from pymongo.errors import PyMongoError

from brook.common.domain.deadlines import Bound, logged_bounds, next_bound
from brook.common.domain.models import Job, UnreadableJob
from brook.common.domain.status import JobStatus
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.runtime.metrics import count_outcome
from brook.dispatcher.attempts.dependents import Dependents
from brook.dispatcher.wiring import Wiring

# After a look that ended nothing while a bound seemed passed (this host's reading of the
# server clock ahead of the server's), the next is this long after, at the least.
RETRY_S = 0.2
# After MongoDB failed a look: wait this long, then look again.
UNAVAILABLE_S = 1.0


class DeadlineTimer:
    def __init__(self, wiring: Wiring, dependents: Dependents) -> None:
        self.store = wiring.store
        self.clock = wiring.clock
        self.bounds = wiring.bounds
        self.dependents = dependents
        self._next = math.inf  # the earliest bound known (the server's time, epoch seconds)
        self._heard = math.inf  # the earliest bound heard of while a look was in flight
        self._wake = asyncio.Event()

    def heard(self, job: Job) -> None:
        """A job that waits without a dispatcher, as the stream or an outcome told it: its
        bound, if sooner than the one the timer waits for, is waited for instead."""
        if job.status not in (JobStatus.WAITING, JobStatus.PENDING):
            return
        bound = next_bound(job, self.bounds)
        if bound is None:
            return
        at = bound[1].timestamp()
        self._heard = min(self._heard, at)
        if at < self._next:
            self._next = at
            self._wake.set()

    def look(self) -> None:
        """Look in MongoDB now (the sweep's: a bound no event announced)."""
        self._next = -math.inf
        self._wake.set()

    async def run(self) -> None:
        self.look()
        while True:
            self._wake.clear()
            wait = self._next - self.clock.now()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    timeout = None if math.isinf(wait) else wait
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            try:
                ended = await self._end_passed()
            except PyMongoError as exc:
                log_event(
                    Event.MONGO_UNAVAILABLE, level="warning", op="deadlines", error=str(exc)[:200]
                )
                await asyncio.sleep(UNAVAILABLE_S)
                continue
            if not ended and self._next <= self.clock.now():
                await asyncio.sleep(RETRY_S)

    async def _end_passed(self) -> int:
        """End every job whose bound passed, then read the next bound: how many it ended."""
        self._heard = math.inf
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        ended = 0
        for job_id, bound in await self.store.past_bounds(self.bounds, now):
            try:
                job = await self.store.end_past_bound(job_id, bound, self.bounds)
            except UnreadableJob as exc:  # ended, but written by hand with odd fields
                log_event(Event.SWEEP_SKIPPED, level="error", job_id=job_id, error=str(exc)[:300])
                continue
            if job is not None:
                ended += 1
                self._ended(job, bound)
        earliest = await self.store.next_bound(self.bounds)
        at = earliest.timestamp() if earliest is not None else math.inf
        self._next = min(at, self._heard)
        return ended

    def _ended(self, job: Job, bound: Bound) -> None:
        error = job.error or {}
        fields = job_fields(job) | {
            "error_type": error.get("type"),
            "error_message": error.get("message"),
            **logged_bounds(job),
            "via": "deadline_timer",
        }
        if bound == "start_by_passed":
            log_event(Event.JOB_CANCELLED, **fields)
        else:
            log_event(Event.JOB_FAILED, level="error", **fields)
        count_outcome(job, job.status.value)
        if job.has_dependents:
            self.dependents.parents_ended(
                [job.id], "cancel" if bound == "start_by_passed" else "failure"
            )
