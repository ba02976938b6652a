"""What this dispatcher holds now: an in-memory map of its leases and where each job is.

MongoDB stays the truth; this only answers "which job is mine, and where is it?" for the
claimer (free room), the heartbeat (what to renew), the watchdog and the dispatcher's
hand-off of claimed jobs to free workers. A held job is, in order:

  claimed ahead  in the buffer (at most `BROOK_PREFETCH` jobs): leased, its task not
                 started, waiting for a free worker
  running        its task runs in a worker process
  finishing      its task ended; its outcome write is in flight (group-committed)

Leases of jobs claimed ahead and running are renewed; a finishing job's write lands well within
its lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Callable

from brook.common.domain.models import Job
from brook.common.store.jobs import Lease

# How long a cancel request seen on the stream is remembered, for a job whose claim
# response has not reached us yet when the event does.
CANCEL_MEMORY_S = 30.0
# Jobs held ahead of the workers are at most about this much of their work, by the mean
# run time of recent tasks (an exponentially weighted mean of the last ~10): enough to hide
# claim round trips for short tasks, none at all for tasks that run this long or longer.
AHEAD_S = 0.2
RUN_WEIGHT = 0.2


def _claim_order(job: Job) -> tuple[int, float, str]:
    return (-job.priority, job.run_at.timestamp(), job.id)


class Holdings:
    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._leases: dict[str, Lease] = {}  # claimed ahead and running: the leases to renew
        self._since: dict[str, float] = {}  # time.monotonic() when each job's claim was sent
        self._claimed_ahead: dict[str, Job] = {}
        self._running: dict[str, Job] = {}
        self._cancels_seen: dict[str, float] = {}
        self._mean_run_s: float | None = None
        # Jobs claimed for their effective priority (priority aging): their stored priority
        # would put them behind the jobs claimed ahead, so they start before those.
        self._aged: set[str] = set()
        self._gone: dict[str, asyncio.Event] = {}  # set when the job is dropped
        self._last_priority: int | None = None  # of the job claimed last

    def record_run(self, seconds: float) -> None:
        """A task ran for `seconds` (from hand-off to result, as the dispatcher saw it)."""
        mean = self._mean_run_s
        self._mean_run_s = seconds if mean is None else mean + RUN_WEIGHT * (seconds - mean)

    def ahead(self, workers: int, prefetch: int) -> int:
        """How many jobs to hold claimed ahead of `workers` workers, at most `prefetch`: about
        `AHEAD_S` of their work at the recent tasks' pace. None before a task has ended (a
        fresh dispatcher does not know its tasks yet), none for long tasks: a job held
        behind them would wait where another dispatcher could run it."""
        mean = self._mean_run_s
        if mean is None:
            return 0
        return min(prefetch, int(workers * AHEAD_S / max(mean, 1e-4)))

    def frees_within(self, workers: int, seconds: float) -> int:
        """About how many of `workers` busy workers free up within `seconds`, at the recent
        tasks' pace (none before a task has ended)."""
        mean = self._mean_run_s
        return 0 if mean is None else int(workers * seconds / max(mean, 1e-4))

    def add(self, job: Job, sent: float | None = None) -> Lease:
        """A claimed job, whose claim was sent at `sent` (`time.monotonic()`; default now):
        it waits for a worker."""
        lease = Lease(job_id=job.id, attempt=job.attempts, has_dependents=job.has_dependents)
        self._since[job.id] = time.monotonic() if sent is None else sent
        self._jobs[job.id] = job
        self._leases[job.id] = lease
        self._claimed_ahead[job.id] = job
        self._last_priority = job.priority
        return lease

    def aged(self, job_id: str) -> None:
        """This job is being claimed for its effective priority (priority aging): once it
        waits here, it starts before the jobs claimed by their stored priority."""
        self._aged.add(job_id)

    def next_claimed_ahead(
        self,
        room: dict[str, int] | None,
        first: Callable[[Job], bool] = lambda _: False,
        keyed: Callable[[str], bool] = lambda _: False,
        line: Callable[[str], object] = lambda _: None,
        fits: Callable[[Job], bool] | None = None,
    ) -> Job | None:
        """The best job claimed ahead (claim order: priority, then due time), among the queues
        that have a free worker (`room`: free workers by queue; None: any queue); jobs that
        `first` picks go before all others, then aged jobs. Among jobs of one priority, the
        job whose `line` (the queues a dispatcher claims together: a queue with limits, or
        every queue without) has the fewest tasks running here goes first, and in a `keyed`
        queue (claimed by turns across keys) the job whose key has: a line's or a key's new
        job does not wait behind the older jobs of a busy one claimed ahead (the buffer
        refills with those as fast as it runs them). Only jobs that `fits` (a worker, or a
        shared seat, is free for them; None: every job) are considered."""
        fitting = [
            j
            for j in self._claimed_ahead.values()
            if (room is None or room.get(j.queue, 0) > 0) and (fits is None or fits(j))
        ]
        if not fitting:
            return None
        running = self._running.values()
        # Asked once per queue, not per job: this runs on every hand-off, over the buffer.
        queues = {j.queue for j in fitting} | {j.queue for j in running}
        line_of = {q: line(q) for q in queues}
        keyed_queues = {q for q in queues if keyed(q)}
        busy = Counter((j.queue, j.key) for j in running if j.queue in keyed_queues)
        lines = Counter(line_of[j.queue] for j in running)

        def order(j: Job) -> tuple[bool, bool, int, int, int, float, str]:
            return (
                not first(j),
                j.id not in self._aged,
                -j.priority,
                lines[line_of[j.queue]],
                busy[(j.queue, j.key)] if j.queue in keyed_queues else 0,
                j.run_at.timestamp(),
                j.id,
            )

        return min(fitting, key=order)

    def count_claimed_ahead(self, which: Callable[[Job], bool]) -> int:
        return sum(1 for job in self._claimed_ahead.values() if which(job))

    def holds_key(self, queue: str, key: str | None) -> bool:
        """Whether a job of `key` in `queue` is claimed ahead or running here."""
        return self.holds_any(lambda j: j.queue == queue and j.key == key)

    def holds_any(self, which: Callable[[Job], bool]) -> bool:
        """Whether a job that `which` picks is claimed ahead or running here."""
        return any(which(j) for j in (*self._claimed_ahead.values(), *self._running.values()))

    def outranks(self, priority: int) -> bool:
        """Whether a job of `priority` would run before some job claimed ahead: one in the
        buffer or, with none there, the job claimed last (a claim in flight brings more
        like it: under a backlog the buffer is often empty while its refill is in flight).
        False before any claim: nothing to jump over."""
        if self._claimed_ahead:
            return priority > min(j.priority for j in self._claimed_ahead.values())
        return self._last_priority is not None and priority > self._last_priority

    def start(self, job_id: str, *, shared: bool = False) -> Lease:
        """Its task was handed to a worker (`shared`: a seat in a shared worker process,
        which its lease then says, for the writes of its attempt)."""
        self._running[job_id] = self._claimed_ahead.pop(job_id)
        self._aged.discard(job_id)
        if shared:
            self._leases[job_id] = dataclasses.replace(self._leases[job_id], shared=True)
        return self._leases[job_id]

    def withdraw(self, job_id: str) -> Job | None:
        """Take a job claimed ahead out of the buffer (cancelled, lost or handed back): it
        will not start. None if it is not in the buffer."""
        job = self._claimed_ahead.pop(job_id, None)
        self._aged.discard(job_id)
        if job is not None:
            self._leases.pop(job_id, None)
            self._since.pop(job_id, None)
        return job

    def worker_done(self, job_id: str) -> None:
        """Its task ended: it is finishing (its outcome is being written)."""
        self._running.pop(job_id, None)
        self._leases.pop(job_id, None)
        self._since.pop(job_id, None)

    async def gone(self, job_id: str) -> None:
        """Return once this job is no longer held here (at once if it is not)."""
        if job_id in self._jobs:
            await self._gone.setdefault(job_id, asyncio.Event()).wait()

    def drop(self, job_id: str) -> None:
        gone = self._gone.pop(job_id, None)
        if gone is not None:
            gone.set()
        self._claimed_ahead.pop(job_id, None)
        self._aged.discard(job_id)
        self._running.pop(job_id, None)
        self._leases.pop(job_id, None)
        self._since.pop(job_id, None)
        self._jobs.pop(job_id, None)

    def count(self, queue: str | None = None) -> int:
        """Jobs held (in `queue`, or in all queues), finishing ones included."""
        if queue is None:
            return len(self._jobs)
        return sum(1 for job in self._jobs.values() if job.queue == queue)

    def active(
        self, queue: str | None = None, which: Callable[[Job], bool] | None = None
    ) -> int:
        """Jobs claimed ahead or running (in `queue`, or in all queues; those `which` picks):
        the leases the concurrency-plus-prefetch rule counts."""
        jobs = [*self._claimed_ahead.values(), *self._running.values()]
        if queue is not None:
            jobs = [job for job in jobs if job.queue == queue]
        return len(jobs) if which is None else sum(1 for job in jobs if which(job))

    def running_count(self, queue: str | None = None) -> int:
        """Tasks running now (in `queue`, or in all queues): never more than the workers."""
        if queue is None:
            return len(self._running)
        return sum(1 for job in self._running.values() if job.queue == queue)

    def finishing_count(self) -> int:
        return len(self._jobs) - len(self._claimed_ahead) - len(self._running)

    def lease(self, job_id: str) -> Lease | None:
        """The lease of a job claimed ahead or running here (None once its task has ended)."""
        return self._leases.get(job_id)

    def job(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def jobs(self) -> list[Job]:
        return list(self._jobs.values())

    def claimed_ahead(self) -> list[Job]:
        return sorted(self._claimed_ahead.values(), key=_claim_order)

    def running(self) -> list[Lease]:
        """The leases to renew: jobs claimed ahead and running."""
        return list(self._leases.values())

    def lease_since(self, job_id: str) -> float:
        """When the claim of a held job was sent (`time.monotonic()`): the server set its
        lease from after that, however long the answer took to come back."""
        return self._since.get(job_id, -float("inf"))

    def is_claimed_ahead(self, job_id: str) -> bool:
        """Whether the job is held and waits for a worker (its task has not started)."""
        return job_id in self._claimed_ahead

    def is_running(self, job_id: str) -> bool:
        """Whether the job is held and not yet finishing (claimed ahead or running)."""
        return job_id in self._leases

    # -- cancel requests that may arrive before the claim's answer ---------------------------

    def note_cancel(self, job_id: str) -> None:
        self._cancels_seen[job_id] = time.monotonic()

    def cancel_was_seen(self, job_id: str) -> bool:
        seen = self._cancels_seen.get(job_id)
        return seen is not None and time.monotonic() - seen < CANCEL_MEMORY_S

    def forget_old_cancels(self) -> None:
        now = time.monotonic()
        for job_id, seen in list(self._cancels_seen.items()):
            if now - seen > CANCEL_MEMORY_S:
                del self._cancels_seen[job_id]
