"""One attempt of a held job on a worker process: hand it over, wait for its end, write how
it ended (after its last progress report has landed), and let the job go. `started_at` and
`finished_at` are the task's own start and end on this dispatcher's reading of the server
clock, written with the outcome (or sooner, for a long task: `start_marks.py`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from pymongo.errors import PyMongoError

from brook.common.domain.models import Job
from brook.common.protocol.runner import KillReason, Outcome, ReservedWorker, RunJob, Runner
from brook.common.runtime import tracing
from brook.common.runtime.metrics import JOB_WAIT
from brook.common.store.jobs import Lease, RunTimes
from brook.dispatcher.attempts.outcomes import Outcomes
from brook.dispatcher.attempts.progress import ProgressKeeper
from brook.dispatcher.attempts.start_marks import StartMarks
from brook.dispatcher.wiring import Wiring


class Runs:
    def __init__(
        self,
        wiring: Wiring,
        runner: Runner,
        starts: StartMarks,
        progress: ProgressKeeper,
        outcomes: Outcomes,
        worker_freed: Callable[[], None],
        ended: Callable[[Job, bool], None],
    ) -> None:
        """`worker_freed`: a job's task ended, its worker is free (hand it the next job);
        `ended`: a job is no longer held here, and whether its attempt is over in MongoDB
        (its final write landed, or another attempt or owner holds it)."""
        self.settings = wiring.settings
        self.store = wiring.store
        self.owner = wiring.owner
        self.clock = wiring.clock
        self.holdings = wiring.holdings
        self.runner = runner
        self.starts = starts
        self.progress = progress
        self.outcomes = outcomes
        self.worker_freed = worker_freed
        self.ended = ended

    async def end_unstarted(self, job: Job, lease: Lease, reason: KillReason) -> None:
        over = False
        try:
            verdict = await self.outcomes.record(job, lease, Outcome(kind=reason), 0.0)
            over = verdict.kind in ("applied", "lost")
        finally:
            self.ended(job, over)

    async def execute(self, worker: ReservedWorker, job: Job, lease: Lease) -> None:
        timeout = job.timeout_s or self.settings.default_timeout_s
        run = RunJob(
            job_id=job.id,
            attempt=job.attempts,
            task=job.task,
            payload=job.payload,
            owner=self.owner,
            steps=job.step_results(),
            steps_bytes=job.steps_bytes,
            server_offset=self.clock.offset,
            queue=job.queue,
            trigger=(job.trigger or {}).get("name"),
            due_at=max(job.run_at, job.created_at),
            trace=job.trace,
            links=await self._parent_traces(job),
            shared=lease.shared,
            output_chunks=int((job.output or {}).get("chunks", 0)),
            output_bytes=int((job.output or {}).get("bytes", 0)),
        )
        sent = time.monotonic()
        mark = self.starts.arm(lease, sent)
        JOB_WAIT.observe(max((self.clock.stamp(sent) - job.run_at).total_seconds(), 0.0))
        over = False
        try:
            try:
                outcome = await self.runner.run(worker, run, timeout)
            finally:
                mark.cancel()
                self.holdings.worker_done(job.id)
                self.worker_freed()  # its queue has a free worker now
            ran, elapsed = self._run_times(outcome)
            self.holdings.record_run(elapsed)
            await self.progress.settle(job.id)
            verdict = await self.outcomes.record(job, lease, outcome, elapsed, ran=ran)
            # The job no longer runs under this attempt: its final write landed, or another
            # attempt or owner holds it. Only then may its queue slot (if any) go.
            over = verdict.kind in ("applied", "lost")
        finally:
            self.ended(job, over)

    async def _parent_traces(self, job: Job) -> tuple[dict[str, str], ...]:
        """The trace contexts of a workflow child's parents, for its run's span links (only
        while tracing: one read)."""
        if not job.depends_on or not tracing.active():
            return ()
        try:
            return tuple(await self.store.trace_contexts(job.depends_on))
        except PyMongoError:
            return ()  # a span without its links rather than a job held up

    def _run_times(self, outcome: Outcome) -> tuple[RunTimes, float]:
        """The task's start and end on the server's clock (as read here), and its run time,
        from the moments the runner sent the job and saw it end, not from when this
        coroutine got to run again: the worker may have started its next job meanwhile."""
        ended = outcome.ended if outcome.ended is not None else time.monotonic()
        started = outcome.started if outcome.started is not None else ended
        ran = RunTimes(started_at=self.clock.stamp(started), finished_at=self.clock.stamp(ended))
        return ran, ended - started
