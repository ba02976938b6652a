"""The dispatcher: the seed article's listener and watchdog loops, event-driven and fenced.

Its modules stand in three rooms (docs/architecture.md has the map): `claiming/` (what to
lease, and when), `attempts/` (the writes for the jobs it holds) and `following/` (the
streams it follows). `Dispatcher.run()` wires the parts together and runs them as
supervised, named tasks:
  stream     change stream → wake-ups (new/requeued work) and cancel requests
             (`following/stream.py`)
  tokens     saves the stream's resume token, coalesced majority writes (`following/stream.py`)
  claimer    while there is room: lease the best due jobs, ahead of free workers, each target
             by its claim policy (`claiming/claimer.py`, `claiming/policies.py`)
  limits     the cluster-wide queue limits: a change stream on `brook_queues`, and a
             re-read every sweep (`claiming/limits.py`)
  heartbeat  renews this dispatcher's leases in one write; kills workers of lost leases
             (`attempts/leases.py`)
  watchdog   slow sweep: requeue expired leases, settle the dependents of parents whose
             settler died, claim what no event announced (`attempts/watchdog.py`)
  schedules  submits each cron tick's job, once for the cluster (`following/schedules.py`)
  triggers   one follower per trigger, holding its lease: a job per matching change in an
             application's collection, once for the cluster (`following/triggers.py`)
  presence   keeps this dispatcher's tasks and queues published, for clients
             (`following/presence.py`)
A claimed job waits in `Holdings` until a worker is free (`hand_off.py`); then its attempt
runs as a supervised task that ends with one fenced write (`attempts/runs.py`,
`attempts/outcomes.py`). A running task's durable steps come up its worker's pipe and are
checkpointed here, fenced (`attempts/step_keeper.py`). A crash of any background task stops
the dispatcher loudly.

Start-up order loses nothing: the stream is opened first, then the backlog is swept,
then the stream is followed.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from brook.common.domain.deadlines import Defaults
from brook.common.domain.models import Job, UnreadableJob
from brook.common.domain.schedules import Schedule
from brook.common.domain.triggers import Trigger
from brook.common.protocol.runner import (
    ProgressReport,
    Runner,
    StepAck,
    StepRecord,
)
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import Supervisor
from brook.common.store.failover_retry import ride_out
from brook.common.store.jobs import JobStore
from brook.common.store.queues import QueueStore
from brook.common.store.quotas import QuotaStore
from brook.common.store.schedules import ScheduleStore
from brook.dispatcher.attempts.deadlines import DeadlineTimer
from brook.dispatcher.attempts.dependents import Dependents
from brook.dispatcher.attempts.leases import LeaseKeeper
from brook.dispatcher.attempts.outcomes import Outcomes
from brook.dispatcher.attempts.output_pruner import OutputPruner
from brook.dispatcher.attempts.progress import ProgressKeeper
from brook.dispatcher.attempts.runs import Runs
from brook.dispatcher.attempts.start_marks import StartMarks
from brook.dispatcher.attempts.step_keeper import StepKeeper
from brook.dispatcher.attempts.watchdog import Watchdog
from brook.dispatcher.claiming.claimer import Claimer
from brook.dispatcher.claiming.holdings import Holdings
from brook.dispatcher.claiming.insert_hints import Announced, InsertHints
from brook.dispatcher.claiming.limits import Limits
from brook.dispatcher.claiming.quota_gate import QuotaGate
from brook.dispatcher.following.presence import Presence
from brook.dispatcher.following.schedules import ScheduleRunner
from brook.dispatcher.following.stream import StreamFollower, TokenSaver
from brook.dispatcher.following.triggers import TriggerRunner
from brook.dispatcher.hand_off import HandOff
from brook.dispatcher.wiring import Wiring

# After the grace period: how long stopped jobs may take to be handed back, and the
# resume token to be saved, before the dispatcher exits anyway (MongoDB may be down).
RELEASE_WINDOW_S = 2.0
TOKEN_FLUSH_S = 0.5
CANCEL_WAIT_S = 0.5


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        runner: Runner,
        tasks: frozenset[str],
        schedules: Sequence[Schedule] = (),
        triggers: Sequence[Trigger] = (),
        quotas: Mapping[str, Mapping[str, int]] | None = None,
        bounds: Defaults | None = None,
    ) -> None:
        """`tasks`: the task names this dispatcher's workers run; it claims only those.
        `quotas`: the quotas each task's jobs draw on by default (`@task(quotas=...)`).
        `bounds`: their default deadlines (`@task(..., start_within_s=, deadline_s=)`)."""
        self.task_quotas = dict(quotas or {})
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
            bounds=bounds or {},
        )
        self.hand_off = hand_off = HandOff(wiring, runner)
        self.limits, self.claimer = self._claiming(wiring, hand_off)
        self._attempts(wiring, hand_off)
        self._following(wiring, schedules, triggers)

    def _claiming(self, wiring: Wiring, hand_off: HandOff) -> tuple[Limits, Claimer]:
        """The claimer, and the cluster-wide queue limits it claims within."""
        limits = Limits(wiring, QueueStore(wiring.store.db))
        gate = QuotaGate(wiring, QuotaStore(wiring.store.db), self.task_quotas)
        gate.start, gate.refuse = hand_off.claimed, hand_off.refused
        claimer = Claimer(wiring, gate.take, limits, refuse=hand_off.refused)
        hand_off.quotas = self.quota_gate = gate
        claimer.free_workers = self.runner.free_workers
        claimer.room.shared = frozenset(self.runner.shared)
        claimer.room.free_seats = self.runner.free_seats
        hand_off.claimer, hand_off.limits = claimer, limits
        self.announced = Announced()
        self.hints = InsertHints(wiring.store, wiring.tasks, self.announced, self._on_change)
        return limits, claimer

    def _attempts(self, wiring: Wiring, hand_off: HandOff) -> None:
        """The writes for the jobs it holds: leases, the watchdog, outcomes, progress, steps
        and start marks, and the runs of attempts that make them."""
        store, owner, spawn = wiring.store, wiring.owner, wiring.spawn
        self.dependents = Dependents(wiring.settings, store, spawn)
        self.leases = hand_off.leases = LeaseKeeper(wiring, hand_off.stop)
        self.deadlines = DeadlineTimer(wiring, self.dependents)
        self.watchdog = Watchdog(
            wiring, hand_off.stop, self.leases.cancel, self._swept, self.dependents
        )
        self.starts = StartMarks(store, owner, wiring.clock, spawn)
        lease_s = wiring.settings.lease_seconds
        self.steps = StepKeeper(store, owner, wiring.clock, lease_s, spawn)
        self.outcomes = Outcomes(
            wiring.settings, store, owner, spawn, self.dependents, self.steps, wiring.bounds
        )
        self.outcomes.waits = self.deadlines.heard
        self.progress = ProgressKeeper(store, owner, spawn)
        self.output_pruner = OutputPruner(store)
        self.runs = hand_off.runs = Runs(
            wiring,
            self.runner,
            self.starts,
            self.progress,
            self.outcomes,
            hand_off.worker_freed,
            hand_off.ended,
        )

    def _following(
        self, wiring: Wiring, schedules: Sequence[Schedule], triggers: Sequence[Trigger]
    ) -> None:
        """The streams it follows: the jobs' changes (and its resume token), cron schedules,
        triggers, and its own presence."""
        store, owner = wiring.store, wiring.owner
        self.tokens = TokenSaver(store, wiring.name)
        self.stream = StreamFollower(
            store, wiring.name, self.tokens, self._on_change, self.watchdog.try_sweep
        )
        self.schedules = ScheduleRunner(
            schedules, store, ScheduleStore(store.db), wiring.clock, owner
        )
        lease_s = wiring.settings.lease_seconds
        self.triggers = TriggerRunner(triggers, store, owner, lease_s)
        self.presence = Presence(wiring)

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set, then shut down by a hard deadline. A crash of any
        loop or per-job task stops the dispatcher too, and is raised."""
        log_event(
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
        log_event(Event.DISPATCHER_STOPPED, owner=self.owner)

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
        self.loops.spawn(self.deadlines.run(), "deadlines")
        self.loops.spawn(self.output_pruner.run(), "output-pruner")
        self.loops.spawn(self.quota_gate.run(), "quota-holds")
        self.loops.spawn(self.schedules.run(), "schedules")
        self.loops.spawn(self.triggers.run(), "triggers")
        await workers
        log_event(Event.DISPATCHER_READY, owner=self.owner, workers=self.runner.free_workers())

    async def _shutdown(self) -> None:
        """Stop claiming → let running jobs finish within the grace period → stop the rest
        and hand their jobs back to `pending` → exit by a hard deadline whatever MongoDB's
        state: a job that could not be handed back comes back at lease expiry."""
        grace = self.settings.shutdown_grace_seconds
        deadline = time.monotonic() + grace + RELEASE_WINDOW_S
        self.claimer.stop()
        self.hand_off.closing = True
        self.outcomes.cut_off(deadline)
        log_event(
            Event.DISPATCHER_STOPPING,
            owner=self.owner,
            running=self.holdings.running_count(),
            claimed_ahead=len(self.holdings.claimed_ahead()),
            grace_s=grace,
        )
        for job in self.holdings.claimed_ahead():  # never started: handed back at once
            self.hand_off.stop(job.id, "shutdown")
        await self.supervisor.wait(grace)
        for lease in self.holdings.running():
            self.hand_off.stop(lease.job_id, "shutdown")
        await self.supervisor.wait(max(deadline - time.monotonic(), 0.0))
        for job in self.holdings.jobs():
            log_event(
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

    def _swept(self) -> None:
        """After each sweep: the claimer looks for due work, the deadline timer for bounds."""
        self.claimer.sweep_done()
        self.deadlines.look()

    def wake(self) -> None:
        """A worker process is free: it became ready, or reported its job's result (called
        by the runner). Hand it the best job claimed ahead at once."""
        self.hand_off.fill_workers()

    def on_progress(self, report: ProgressReport) -> None:
        """A running task reported progress (called by the runner)."""
        self.progress.report(report)

    def on_step(self, step: StepRecord, reply: Callable[[StepAck], None]) -> None:
        """A running task finished a step (called by the runner): checkpoint it, fenced."""
        self.steps.record(step, reply)

    # -- events ----------------------------------------------------------------------------

    def _on_change(self, change: Mapping[str, Any]) -> None:
        """A job's change, from the stream or an oplog hint: only a wake-up, so one this
        cannot use (a job written by hand with odd fields) is logged and passed over, never
        the stream's end: the sweep claims whatever it announced."""
        try:
            self._heard(change)
        except Exception as exc:
            log_event(
                Event.STREAM_CHANGE_SKIPPED,
                level="error",
                job_id=str((change.get("documentKey") or {}).get("_id")),
                error=f"{type(exc).__name__}: {exc}"[:300],
            )

    def _heard(self, change: Mapping[str, Any]) -> None:
        job_id = str(change["documentKey"]["_id"])
        fields = change.get("updateDescription", {}).get("updatedFields", {})
        if fields.get("cancel_requested") is True:
            self.leases.cancel_requested(job_id)
            return
        inserted = change.get("fullDocument")
        if inserted is not None:
            self._bounded(job_id, inserted)
            if inserted.get("status") == "waiting":
                return  # heard for its bound only: it is not due before its parents end
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
        run_at = fields.get("run_at") or (inserted or {}).get("run_at")
        self.claimer.due_at(
            run_at if isinstance(run_at, datetime) else None,
            priority if isinstance(priority, int) else None,
            queue if isinstance(queue, str) else None,
            key if isinstance(key, str) else None,
        )

    def _bounded(self, job_id: str, inserted: Mapping[str, Any]) -> None:
        """A new job with a bound (its own, or its task's default): the deadline timer
        waits for it if it comes sooner."""
        bounds = self.wiring.bounds
        if "start_by" in inserted or "deadline" in inserted or inserted.get("task") in bounds:
            with contextlib.suppress(UnreadableJob):  # the timer's own look finds it, or not
                self.deadlines.heard(Job.from_doc({"status": "pending", **inserted, "_id": job_id}))
