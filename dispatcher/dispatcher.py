"""The dispatcher: the seed article's listener and watchdog loops, event-driven and fenced.

`Dispatcher.run()` wires the parts together and runs them as supervised, named tasks:
  stream     change stream → wake-ups (new/requeued work) and cancel requests (`stream.py`)
  tokens     saves the stream's resume token, coalesced majority writes (`stream.py`)
  claimer    while there is room: lease the best due jobs, ahead of free workers (`claimer.py`)
  limits     the cluster-wide queue limits: a change stream on `brook_queues`, and a
             re-read every sweep; a limited queue's claims take its slots (`limits.py`)
  heartbeat  renews this dispatcher's leases in one write; kills workers of lost leases
  watchdog   slow sweep: requeue expired leases, settle the dependents of parents whose
             settler died, claim what no event announced (`leases.py`, `dependents.py`)
  schedules  submits each cron tick's job, once for the cluster (`schedules.py`)
  triggers   one follower per trigger, holding its lease: a job per matching change in an
             application's collection, once for the cluster (`triggers.py`)
  presence   keeps this dispatcher's tasks and queues published, for clients (`presence.py`)
A running task's durable steps come up its worker's pipe and are checkpointed here, fenced
(`steps.py`); a task that sleeps or waits for a signal ends its run, and its job goes back
to pending until its wake time (or a signal).
A claimed job waits in `Holdings` until a worker is free (at once, when one is); then it
runs as a supervised task that ends with one fenced write (`outcomes.py`), after its last
progress report (`progress.py`) has landed; a job with dependents then has them settled in
the background (`dependents.py`). The worker takes its next job as soon as it reports its
result; the outcome is written behind it, group-committed. `started_at` and `finished_at`
are the task's own start and end on this dispatcher's reading of the server clock, written
with the outcome (or sooner, for a long task: `start_times.py`). A crash of any background task
stops the dispatcher loudly.

Start-up order loses nothing: the stream is opened first, then the backlog is swept,
then the stream is followed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from brook.common.domain.models import Job
from brook.common.domain.schedules import Schedule
from brook.common.domain.triggers import Trigger
from brook.common.protocol.runner import (
    KillReason,
    ProgressReport,
    Runner,
    StepAck,
    StepRecord,
)
from brook.common.runtime.log_events import Event, emit, job_fields
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import Supervisor
from brook.common.store.failover_retry import ride_out
from brook.common.store.jobs import JobStore, Lease
from brook.common.store.queues import QueueStore
from brook.common.store.schedules import ScheduleStore
from brook.dispatcher.attempts.dependents import Dependents
from brook.dispatcher.attempts.leases import LeaseKeeper
from brook.dispatcher.attempts.outcomes import Outcomes
from brook.dispatcher.attempts.progress import ProgressKeeper
from brook.dispatcher.attempts.runs import Runs
from brook.dispatcher.attempts.start_marks import StartMarks
from brook.dispatcher.attempts.step_keeper import StepKeeper
from brook.dispatcher.attempts.watchdog import Watchdog
from brook.dispatcher.claiming.claimer import Claimer
from brook.dispatcher.claiming.holdings import Holdings
from brook.dispatcher.claiming.insert_hints import Announced, InsertHints
from brook.dispatcher.claiming.limits import Limits
from brook.dispatcher.following.presence import Presence
from brook.dispatcher.following.schedules import ScheduleRunner
from brook.dispatcher.following.stream import StreamFollower, TokenSaver
from brook.dispatcher.following.triggers import TriggerRunner
from brook.dispatcher.wiring import Wiring

# After the grace period: how long stopped jobs may take to be handed back, and the
# resume token to be saved, before the dispatcher exits anyway (MongoDB may be down).
RELEASE_WINDOW_S = 2.0
TOKEN_FLUSH_S = 0.5
CANCEL_WAIT_S = 0.5
# Time allowed from a hand-off to the task's start in its worker (a pipe write away).
HAND_OFF_S = 0.02


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        runner: Runner,
        tasks: frozenset[str],
        schedules: Sequence[Schedule] = (),
        triggers: Sequence[Trigger] = (),
    ) -> None:
        """`tasks`: the task names this dispatcher's workers run; it claims only those."""
        self.settings = settings
        self.store = store
        self.runner = runner
        self.tasks = tasks
        self.name = settings.dispatcher_name or socket.gethostname()
        # Unique per process run: a restarted dispatcher never matches its old leases.
        self.owner = f"{self.name}:{os.getpid()}:{secrets.token_hex(3)}"
        self.loops = Supervisor()  # the named loops: stream, tokens, claimer, heartbeat, …
        self.supervisor = Supervisor()  # one task per running job, and group-commit writers
        self.holdings = Holdings()
        self.clock = clock = store.clock
        self.wiring = wiring = Wiring(
            settings=settings,
            store=store,
            owner=self.owner,
            name=self.name,
            tasks=tasks,
            holdings=self.holdings,
            clock=clock,
            spawn=self.supervisor.spawn,
        )
        self._closing = False
        self.limits, self.claimer = self._claiming(wiring)
        self.dependents = Dependents(settings, store, self.supervisor.spawn)
        self.leases = LeaseKeeper(wiring, self._stop)
        self.watchdog = Watchdog(
            wiring, self._stop, self.leases.cancel, self.claimer.sweep_done, self.dependents
        )
        self.starts = StartMarks(store, self.owner, clock, self.supervisor.spawn)
        self.steps = StepKeeper(
            store, self.owner, clock, settings.lease_seconds, self.supervisor.spawn
        )
        self.outcomes = Outcomes(
            settings, store, self.owner, self.supervisor.spawn, self.dependents, self.steps
        )
        self.tokens = TokenSaver(store, self.name)
        self.stream = StreamFollower(
            store, self.name, self.tokens, self._on_change, self.watchdog.try_sweep
        )
        self.announced = Announced()
        self.hints = InsertHints(store, tasks, self.announced, self._on_change)
        self.progress = ProgressKeeper(store, self.owner, self.supervisor.spawn)
        self.schedules = ScheduleRunner(
            schedules, store, ScheduleStore(store.db), clock, self.owner
        )
        self.triggers = TriggerRunner(triggers, store, self.owner, settings.lease_seconds)
        self.presence = Presence(wiring)
        self.runs = Runs(
            wiring,
            runner,
            self.starts,
            self.progress,
            self.outcomes,
            self._worker_freed,
            self._ended,
        )

    def _claiming(self, wiring: Wiring) -> tuple[Limits, Claimer]:
        """The claimer, and the cluster-wide queue limits it claims within."""
        limits = Limits(wiring, QueueStore(wiring.store.db))
        claimer = Claimer(wiring, self._claimed, limits, refuse=self._refused)
        claimer.free_workers = self.runner.free_slots
        return limits, claimer

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set, then shut down by a hard deadline. A crash of any
        loop or per-job task stops the dispatcher too, and is raised."""
        emit(
            Event.DISPATCHER_STARTED,
            owner=self.owner,
            concurrency=self.settings.worker_slots,
            queues=self.settings.queues,
            tasks=sorted(self.tasks),
            lease_seconds=self.settings.lease_seconds,
        )
        self.loops.spawn(self._start_up(), "start-up")
        stopped = asyncio.ensure_future(stop.wait())
        crashes = [asyncio.ensure_future(s.first_crash()) for s in (self.loops, self.supervisor)]
        # A start-up that never ends (no MongoDB) does not delay a stop.
        await asyncio.wait([stopped, *crashes], return_when=asyncio.FIRST_COMPLETED)
        try:
            await self._shutdown()
        finally:
            self.loops.cancel_all()
            # A driver call stuck on an unreachable server may ignore its cancellation for
            # a long time; it is abandoned rather than waited for.
            await self.loops.wait(CANCEL_WAIT_S)
            for task in (stopped, *crashes):
                task.cancel()
        for crash in crashes:
            if crash.done() and not crash.cancelled() and (exc := crash.exception()) is not None:
                raise exc
        emit(Event.DISPATCHER_STOPPED, owner=self.owner)

    async def _start_up(self) -> None:
        # Worker processes start while this one talks to MongoDB; jobs claimed before a
        # worker is ready wait for it.
        workers = self.loops.spawn(self.runner.start(), "workers")
        await ride_out("ensure_indexes", self.store.ensure_indexes)
        await self.presence.announce()
        self.loops.spawn(self.presence.run(), "presence")
        self.loops.spawn(self.stream.run(), "stream")
        if self.settings.oplog_hints:
            self.loops.spawn(self.hints.run(), "hints")
        self.loops.spawn(self.tokens.run(), "tokens")
        self.loops.spawn(self.limits.follow(), "limits")
        await self.stream.opened.wait()
        # The plain claim must know which queues have limits before it claims anything.
        await self.limits.loaded.wait()
        self.loops.spawn(self.limits.tick(), "limits-tick")
        await ride_out("sweep", self.watchdog.sweep)  # the backlog, after the stream is open
        self.loops.spawn(self.claimer.run(), "claimer")
        self.loops.spawn(self.leases.heartbeat(), "heartbeat")
        self.loops.spawn(self.leases.expiries(), "lease-expiries")
        self.loops.spawn(self.watchdog.run(), "watchdog")
        self.loops.spawn(self.schedules.run(), "schedules")
        self.loops.spawn(self.triggers.run(), "triggers")
        await workers
        emit(Event.DISPATCHER_READY, owner=self.owner, workers=self.runner.free_slots())

    async def _shutdown(self) -> None:
        """Stop claiming → let running jobs finish within the grace period → stop the rest
        and hand their jobs back to `pending` → exit by a hard deadline whatever MongoDB's
        state: a job that could not be handed back comes back at lease expiry."""
        grace = self.settings.shutdown_grace_seconds
        deadline = time.monotonic() + grace + RELEASE_WINDOW_S
        self.claimer.stop()
        self._closing = True
        self.outcomes.cut_off(deadline)
        emit(
            Event.DISPATCHER_STOPPING,
            owner=self.owner,
            running=self.holdings.running_count(),
            claimed_ahead=len(self.holdings.claimed_ahead()),
            grace_s=grace,
        )
        for job in self.holdings.claimed_ahead():  # never started: handed back at once
            self._stop(job.id, "shutdown")
        await self.supervisor.wait(grace)
        for lease in self.holdings.running():
            self._stop(lease.job_id, "shutdown")
        await self.supervisor.wait(max(deadline - time.monotonic(), 0.0))
        for job in self.holdings.jobs():
            emit(
                Event.JOB_RELEASE_FAILED,
                level="warning",
                **job_fields(job),
                reason="not handed back before the shutdown deadline; it returns at lease expiry",
            )
        self.supervisor.cancel_all()
        try:
            async with asyncio.timeout(TOKEN_FLUSH_S):
                await asyncio.gather(
                    self.tokens.flush(),
                    self.presence.retire(),
                    self.triggers.release(),
                    return_exceptions=True,
                )
        except TimeoutError:
            pass

    def wake(self) -> None:
        """A worker process is free: it became ready, or reported its job's result (called
        by the runner). Hand it the best waiting job at once."""
        self._hand_off()

    def on_progress(self, report: ProgressReport) -> None:
        """A running task reported progress (called by the runner)."""
        self.progress.report(report)

    def on_step(self, step: StepRecord, reply: Callable[[StepAck], None]) -> None:
        """A running task finished a step (called by the runner): checkpoint it, fenced."""
        self.steps.record(step, reply)

    # -- events ----------------------------------------------------------------------------

    def _on_change(self, change: Mapping[str, Any]) -> None:
        job_id = str(change["documentKey"]["_id"])
        fields = change.get("updateDescription", {}).get("updatedFields", {})
        if fields.get("cancel_requested") is True:
            self.leases.cancel_requested(job_id)
            return
        inserted = change.get("fullDocument")
        if inserted is not None and not self.claimer.runs(
            inserted.get("task"), inserted.get("queue")
        ):
            return  # a new job this dispatcher would never claim
        if inserted is not None and not self.announced.first(job_id):
            return  # heard of already (a hint, then the stream): its look is done or due
        if inserted is None:
            self.limits.requeued()
        priority = (inserted or {}).get("priority")
        queue = (inserted or {}).get("queue")
        key = (inserted or {}).get("key")
        self.claimer.due_at(
            fields.get("run_at") or (inserted or {}).get("run_at"),
            priority if isinstance(priority, int) else None,
            queue if isinstance(queue, str) else None,
            key if isinstance(key, str) else None,
        )

    # -- one attempt -----------------------------------------------------------------------

    def _claimed(self, job: Job, sent: float) -> None:
        """A claimed job (the claimer's callback), its claim sent at `sent`: it waits for a
        free worker."""
        if self.holdings.job(job.id) is not None:
            # An earlier attempt of it is still held here: the server gave this one, so
            # that one's lease is over. It is stopped, and this one waits until it is gone.
            self._stop(job.id, "lease_lost")
            self.supervisor.spawn(self._claimed_after_older(job, sent), f"job:{job.id}")
            return
        lease = self.holdings.add(job, sent)
        emit(
            Event.JOB_CLAIMED,
            **job_fields(job),
            owner=self.owner,
            priority=job.priority,
            lag_ms=round((self.clock.now() - job.run_at.timestamp()) * 1000, 2),
        )
        if self._closing:  # a claim that was in flight when the shutdown began
            self._stop(job.id, "shutdown")
            return
        if self.leases.fence_if_overdue(lease):
            return  # its claim's answer came back after its lease may have ended
        if self.holdings.cancel_was_seen(job.id):
            self.leases.cancel(job.id)
        self._hand_off()

    def _refused(self, job: Job, sent: float) -> None:
        """A claimed job the admission check does not let start here: handed back at once."""
        self.holdings.add(job, sent)
        self._stop(job.id, "handed_back")

    async def _claimed_after_older(self, job: Job, sent: float) -> None:
        await self.holdings.gone(job.id)
        self._claimed(job, sent)  # fenced there if the wait outlasted its lease

    def _free_slots_by_queue(self) -> dict[str, int] | None:
        queues = self.settings.queues
        if queues is None:
            return None
        return {q: slots - self.holdings.running_count(q) for q, slots in queues.items()}

    def _hand_off(self) -> None:
        """Start waiting jobs, best first, on free workers, within each queue's slots: never
        more tasks at once than slots."""
        while not self._closing and self.runner.free_slots() > 0:
            # A job of a queue with a rate first: it must start within a margin of its claim.
            job = self.holdings.next_claimed_ahead(
                self._free_slots_by_queue(),
                first=lambda j: self.limits.latest_start(j) is not None,
                keyed=self.limits.keyed,
                line=self.claimer.target_of,
            )
            if job is None:
                return
            latest = self.limits.latest_start(job)
            if latest is not None and time.monotonic() + HAND_OFF_S > latest:
                self._stop(job.id, "handed_back")  # too late for its queue's rate
                continue
            worker = self.runner.reserve()
            if worker is None:
                return
            lease = self.holdings.start(job.id)
            self.supervisor.spawn(self.runs.execute(worker, job, lease), f"job:{job.id}")

    def _stop(self, job_id: str, reason: KillReason) -> bool:
        """Stop a held job: kill its worker; or, if it is still waiting, take it out of the
        buffer and write its end (cancelled, handed back; a lost lease writes nothing)."""
        job = self.holdings.withdraw(job_id)
        if job is None:
            return self.runner.kill(job_id, reason)
        lease = Lease(job_id=job.id, attempt=job.attempts, has_dependents=job.has_dependents)
        self.supervisor.spawn(self.runs.end_unstarted(job, lease, reason), f"job:{job.id}")
        self.claimer.worker_freed()
        return True

    def _worker_freed(self) -> None:
        self._hand_off()
        self.claimer.worker_freed()

    def _ended(self, job: Job, over: bool) -> None:
        """A job is no longer held here; `over`: its attempt is over in MongoDB too, so its
        queue or key slot (if any) may go."""
        self.holdings.drop(job.id)
        self.limits.finished(job, over=over)
        self.claimer.worker_freed()
