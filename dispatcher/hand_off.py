"""The hand-off: what becomes of a claimed job until a worker takes it, and after.

A claimed job (the claimer's `start`) waits in `Holdings` until a worker is free (at once,
when one is): the best job claimed ahead goes first, a job of a queue with a rate before
any other (it must start within a margin of its claim, or it is handed back). Its attempt
then runs as a supervised task (`attempts/runs.py`). A held job is stopped here too: its
worker killed, or, still claimed ahead, handed back with its end written.

Deadlines: a job whose `start_by` (it never started) or `deadline` passed is not started,
checked at its claim and again as it is handed to a worker; while held, a timer of its own
stops it at its bound (claimed ahead past its `start_by`, or past its `deadline` whether
claimed ahead or running: its worker is stopped as for a timeout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime

from brook.common.domain.deadlines import deadline_of, next_bound, passed
from brook.common.domain.models import Job
from brook.common.domain.status import JobStatus
from brook.common.protocol.runner import KillReason, Runner
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.store.jobs import Lease
from brook.dispatcher.attempts.leases import LeaseKeeper
from brook.dispatcher.attempts.runs import Runs
from brook.dispatcher.claiming.claimer import Claimer
from brook.dispatcher.claiming.limits import Limits
from brook.dispatcher.claiming.quota_gate import QuotaGate
from brook.dispatcher.wiring import Wiring

# Time allowed from a hand-off to the task's start in its worker (a pipe write away).
HAND_OFF_S = 0.02


def died_shared_twice(job: Job) -> bool:
    """The job's last two attempts both ended with the death of their shared worker process
    (by its history: each attempt's end adds an entry; its start, a `running` one)."""
    last = [h for h in job.history if h.get("status") != JobStatus.RUNNING][-2:]
    return len(last) == 2 and all(
        h.get("shared") is True and h.get("error") == "WorkerCrashed" for h in last
    )


class HandOff:
    """Its parts (`claimer`, `limits`, `leases`, `runs`) are set by `Dispatcher`, which
    builds them around this hand-off's callbacks."""

    claimer: Claimer
    limits: Limits
    leases: LeaseKeeper
    runs: Runs
    quotas: QuotaGate | None = None

    def __init__(self, wiring: Wiring, runner: Runner) -> None:
        self.settings = wiring.settings
        self.owner = wiring.owner
        self.clock = wiring.clock
        self.holdings = wiring.holdings
        self.spawn = wiring.spawn
        self.runner = runner
        self.bounds = wiring.bounds
        self.closing = False  # the dispatcher is shutting down: nothing starts any more
        # The timer of each held job with a bound (`start_by`, `deadline`), by job id.
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def claimed(self, job: Job, sent: float) -> None:
        """A claimed job (the claimer's callback), its claim sent at `sent`: it waits for a
        free worker."""
        if self.holdings.job(job.id) is not None:
            # An earlier attempt of it is still held here: the server gave this one, so
            # that one's lease is over. It is stopped, and this one waits until it is gone.
            self.stop(job.id, "lease_lost")
            self.spawn(self._claimed_after_older(job, sent), f"job:{job.id}")
            return
        lease = self.holdings.add(job, sent)
        log_event(
            Event.JOB_CLAIMED,
            **job_fields(job),
            owner=self.owner,
            priority=job.priority,
            lag_ms=round((self.clock.now() - job.run_at.timestamp()) * 1000, 2),
        )
        if self.closing:  # a claim that was in flight when the shutdown began
            self.stop(job.id, "shutdown")
            return
        if self.leases.fence_if_overdue(lease):
            return  # its claim's answer came back after its lease may have ended
        if self.holdings.cancel_was_seen(job.id):
            self.leases.cancel(job.id)
        if self._past_bound(job):
            return
        self._arm(job)
        self.fill_workers()

    def refused(self, job: Job, sent: float) -> None:
        """A claimed job the admission check does not let start here: handed back at once."""
        self.holdings.add(job, sent)
        self.stop(job.id, "handed_back")

    async def _claimed_after_older(self, job: Job, sent: float) -> None:
        await self.holdings.gone(job.id)
        self.claimed(job, sent)  # fenced there if the wait outlasted its lease

    def _free_workers_by_queue(self) -> dict[str, int] | None:
        queues = self.settings.queues
        if queues is None:
            return None
        return {q: n - self.holdings.running_count(q) for q, n in queues.items()}

    def fill_workers(self) -> None:
        """Start jobs claimed ahead, best first, on free workers (a shared job on a free seat
        of a shared worker process), within each queue's workers (`BROOK_QUEUES`): never
        more tasks at once than workers and seats."""
        runner = self.runner
        while not self.closing and (runner.free_workers() > 0 or runner.free_seats() > 0):
            # A job of a queue with a rate first: it must start within a margin of its claim.
            job = self.holdings.next_claimed_ahead(
                self._free_workers_by_queue(),
                first=lambda j: self.limits.latest_start(j) is not None,
                keyed=self.limits.keyed,
                line=self.claimer.target_of,
                fits=self._fitter(),
            )
            if job is None:
                return
            latest = self.limits.latest_start(job)
            if latest is not None and time.monotonic() + HAND_OFF_S > latest:
                self.stop(job.id, "handed_back")  # too late for its queue's rate
                continue
            if self._past_bound(job):
                continue
            shared = self.runs_shared(job)
            worker = runner.reserve(job.task if shared else None)
            if worker is None:
                return
            lease = self.holdings.start(job.id, shared=shared)
            self.spawn(self.runs.execute(worker, job, lease), f"job:{job.id}")

    def runs_shared(self, job: Job) -> bool:
        """Whether a job runs in a shared worker process: its task shares, and its last two
        attempts did not both end with the death of their shared process (then it runs in
        a process of its own, so that one crashing task cannot keep killing neighbours)."""
        return job.task in self.runner.shared and not died_shared_twice(job)

    def _fitter(self) -> Callable[[Job], bool] | None:
        """What a job claimed ahead needs to start now: a free worker, or for a shared job a
        free seat of its task (each asked once per hand-off, not once per job of the
        buffer). None when every job fits: no task shares, and the hand-off runs only while
        a worker is free."""
        runner = self.runner
        if not runner.shared:
            return None
        worker_free = runner.free_workers() > 0
        seat_free: dict[str, bool] = {}

        def fits(job: Job) -> bool:
            if not self.runs_shared(job):
                return worker_free
            if job.task not in seat_free:
                seat_free[job.task] = runner.free_seats(job.task) > 0
            return seat_free[job.task]

        return fits

    def stop(self, job_id: str, reason: KillReason) -> bool:
        """Stop a held job: kill its worker; or, if it is still claimed ahead, take it out of
        the buffer and write its end (cancelled, handed back; a lost lease writes nothing)."""
        job = self.holdings.withdraw(job_id)
        if job is None:
            return self.runner.kill(job_id, reason)
        lease = Lease(job_id=job.id, attempt=job.attempts, has_dependents=job.has_dependents)
        self.spawn(self.runs.end_unstarted(job, lease, reason), f"job:{job.id}")
        self.claimer.worker_freed()
        return True

    def worker_freed(self) -> None:
        self.fill_workers()
        self.claimer.worker_freed()

    # -- deadlines ---------------------------------------------------------------------------

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    def _past_bound(self, job: Job) -> bool:
        """A job claimed ahead whose `start_by` or `deadline` passed is stopped, not started."""
        bound = passed(job, self.bounds, self._now())
        if bound is None:
            return False
        self.stop(job.id, bound)
        return True

    def _arm(self, job: Job, *, started: bool = False) -> None:
        """Wake at the job's next bound while it is held (`started`: only its deadline)."""
        bound = next_bound(job, self.bounds)
        at = deadline_of(job, self.bounds) if started else (bound[1] if bound else None)
        if at is None:
            return
        delay = max(at.timestamp() - self.clock.now(), 0.0)
        loop = asyncio.get_running_loop()
        self._timers[job.id] = loop.call_later(delay, self._bound_reached, job.id, job.attempts)

    def _bound_reached(self, job_id: str, attempt: int) -> None:
        self._timers.pop(job_id, None)
        job = self.holdings.job(job_id)
        if job is None or job.attempts != attempt or not self.holdings.is_running(job_id):
            return  # gone, another attempt, or finishing
        if self.holdings.is_claimed_ahead(job_id):
            if not self._past_bound(job):
                self._arm(job)
            return
        deadline = deadline_of(job, self.bounds)
        if deadline is not None and deadline <= self._now():
            self.stop(job_id, "deadline_exceeded")  # its worker, as for a timeout
        else:
            self._arm(job, started=True)

    def ended(self, job: Job, over: bool) -> None:
        """A job is no longer held here; `over`: its attempt is over in MongoDB too, so its
        queue or key slot (if any) may go."""
        timer = self._timers.pop(job.id, None)
        if timer is not None:
            timer.cancel()
        self.holdings.drop(job.id)
        self.limits.finished(job, over=over)
        if self.quotas is not None:
            self.quotas.ended(job)
        self.claimer.worker_freed()
