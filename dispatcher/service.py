"""The dispatcher: the seed article's listener and watchdog loops, event-driven and fenced.

One `run()` owns named tasks in a TaskGroup:
  stream     change stream → wake-ups (new/requeued work) and cancel requests
  tokens     saves the stream's resume token (majority writes, coalesced)
  claimer    while a worker slot is free: claim the best due job (findOneAndUpdate lease)
  heartbeat  renews this dispatcher's leases in one write; kills workers of lost leases
  watchdog   slow sweep: requeue expired leases, claim what no event announced

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
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pymongo.errors import PyMongoError

from common.backoff import backoff_delay
from common.db import is_transient
from common.errors import LeaseLost
from common.events import Event, emit, job_fields
from common.models import Job
from common.runner import Outcome, RunJob, Runner
from common.settings import Settings
from common.status import JobStatus
from common.store import JobStore, Lease
from dispatcher.completer import Completer
from dispatcher.stream import StreamFollower

# How long a cancel request seen on the stream is remembered, for a job whose claim
# response has not reached us yet when the event does.
CANCEL_MEMORY_S = 30.0


class Dispatcher:
    def __init__(self, settings: Settings, store: JobStore, runner: Runner) -> None:
        self.settings = settings
        self.store = store
        self.runner = runner
        self.name = settings.dispatcher_name or socket.gethostname()
        # Unique per process run: a restarted dispatcher never matches its old leases.
        self.owner = f"{self.name}:{os.getpid()}:{secrets.token_hex(3)}"
        self.stream = StreamFollower(store, self.name, self._on_change, self._on_reset)
        self.completer = Completer(store, self.owner, self._retrying, settings.lease_seconds * 2)
        self._wake = asyncio.Event()
        self._stopping = False
        self._held: dict[str, Lease] = {}
        self._jobs: dict[str, Job] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._cancel_seen: dict[str, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._clock_offset = 0.0  # server clock - local clock, seconds
        self._empty_claims = 0
        # Wake-up bookkeeping: `_signals` counts reasons to look for work (events, timer,
        # sweeps); `_maybe_more` says the last look may have left due work behind.
        self._signals = 0
        self._maybe_more = True
        self._rearm_timer = True
        self._batch = 1

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        emit(
            Event.DISPATCHER_STARTED,
            owner=self.owner,
            concurrency=self.settings.concurrency,
            lease_seconds=self.settings.lease_seconds,
        )
        await self._retrying("ensure_indexes", self.store.ensure_indexes)
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(self.stream.run(), name="stream"),
                tg.create_task(self.stream.saver.run(), name="tokens"),
            ]
            await self.stream.opened.wait()
            await self._sweep()  # the backlog, after the stream is open
            tasks += [
                tg.create_task(self._claimer(), name="claimer"),
                tg.create_task(self._heartbeat(), name="heartbeat"),
                tg.create_task(self._watchdog(), name="watchdog"),
            ]
            emit(Event.DISPATCHER_READY, owner=self.owner)
            await stop.wait()
            await self._shutdown()
            for task in tasks:
                task.cancel()
        emit(Event.DISPATCHER_STOPPED, owner=self.owner)

    async def _shutdown(self) -> None:
        """Stop claiming → let running jobs finish within the grace period → stop the rest
        and hand their jobs back to `pending` at once."""
        self._stopping = True
        emit(
            Event.DISPATCHER_STOPPING,
            owner=self.owner,
            running=len(self._running),
            grace_s=self.settings.shutdown_grace_seconds,
        )
        if self._running:
            await asyncio.wait(set(self._running), timeout=self.settings.shutdown_grace_seconds)
        for job_id in list(self._held):
            self.runner.kill(job_id, "shutdown")
        if self._running:
            await asyncio.wait(set(self._running), timeout=30.0)
        with contextlib.suppress(PyMongoError):
            await asyncio.wait_for(self.stream.saver.flush(), 5.0)

    def wake(self) -> None:
        """A worker process became ready (called by the runner)."""
        self._signal()

    def _signal(self) -> None:
        """There may be due work: look for it."""
        self._signals += 1
        self._maybe_more = True
        self._wake.set()

    # -- events ----------------------------------------------------------------------------

    def _on_change(self, change: Mapping[str, Any]) -> None:
        job_id = str(change["documentKey"]["_id"])
        fields = change.get("updateDescription", {}).get("updatedFields", {})
        if fields.get("cancel_requested") is True:
            self._cancel_seen[job_id] = time.monotonic()
            if job_id in self._held:
                self._cancel(job_id)
            return
        run_at = fields.get("run_at") or change.get("fullDocument", {}).get("run_at")
        if isinstance(run_at, datetime) and run_at.timestamp() > self._server_now() + 0.002:
            self._schedule(run_at.timestamp())
        else:
            self._signal()

    async def _on_reset(self) -> None:
        """The stream lost its history or was invalidated: events may be missing, so sweep."""
        await self._sweep()

    def _cancel(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        emit(Event.JOB_CANCEL_REQUESTED, **(job_fields(job) if job else {"job_id": job_id}))
        self.runner.kill(job_id, "cancelled")

    # -- claiming --------------------------------------------------------------------------

    async def _claimer(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            while not self._stopping and self._maybe_more:
                # A lease counts against the concurrency until its final write is done, so
                # the jobs collection never shows more running jobs than there are slots.
                room = min(self.settings.concurrency - len(self._jobs), self.runner.free_slots())
                if room <= 0:
                    break  # a finished job or a ready worker wakes us again
                seen = self._signals
                # Claims in flight together overlap their round trips. Start with one and
                # double while every claim finds a job (a backlog); one event then costs
                # one claim, not one per free slot.
                batch = min(room, self._batch)
                got = [await self._claim_one()] if batch == 1 else await self._claim_batch(batch)
                self._batch = min(self._batch * 2, 64) if all(got) else 1
                if False in got and None not in got:
                    continue  # lost races to another dispatcher: there is more, look again
                if None in got:
                    if self._signals == seen:
                        self._maybe_more = False  # nothing due, and no news meanwhile
                    if self._rearm_timer:
                        self._rearm_timer = False
                        await self._arm_timer()
                    if got.count(True) == 0 and self._maybe_more:
                        await asyncio.sleep(0)  # let the news that raced us land
                else:
                    self._empty_claims = 0

    async def _claim_batch(self, n: int) -> list[bool | None]:
        """Claim up to `n` jobs in one write (a backlog); True per job started, None for a
        slot the queue could not fill, False for one lost to another dispatcher's race."""
        slots = [slot for slot in (self.runner.reserve() for _ in range(n)) if slot is not None]
        try:
            jobs, dry = await self.store.claim_many(
                self.owner, self.settings.lease_seconds, len(slots)
            )
        except PyMongoError as exc:
            await self._claim_failed(slots, exc)
            return [False]
        for slot, job in zip(slots, jobs, strict=False):
            self._start(slot, job)
        for slot in slots[len(jobs) :]:
            self.runner.unreserve(slot)
        unfilled: bool | None = None if dry else False
        return [True] * len(jobs) + [unfilled] * (len(slots) - len(jobs))

    async def _claim_one(self) -> bool | None:
        """Claim and start one job; True if one started, None if nothing was due."""
        slot = self.runner.reserve()
        if slot is None:
            return False
        try:
            job = await self.store.claim(self.owner, self.settings.lease_seconds)
        except PyMongoError as exc:
            await self._claim_failed([slot], exc)
            return False
        if job is None:
            self.runner.unreserve(slot)
            return None
        self._start(slot, job)
        return True

    async def _claim_failed(self, slots: list[Any], exc: PyMongoError) -> None:
        """No primary (or similar): give the slots back, wait a little, look again."""
        for slot in slots:
            self.runner.unreserve(slot)
        emit(Event.MONGO_UNAVAILABLE, level="warning", op="claim", error=str(exc)[:200])
        await asyncio.sleep(0.5)
        self._signal()

    def _start(self, slot: Any, job: Job) -> None:
        lease = Lease(job_id=job.id, attempt=job.attempts)
        self._held[job.id] = lease
        self._jobs[job.id] = job
        lag_ms = None
        if job.started_at is not None:
            lag_ms = round((job.started_at - job.run_at).total_seconds() * 1000, 2)
        emit(
            Event.JOB_CLAIMED,
            **job_fields(job),
            owner=self.owner,
            priority=job.priority,
            lag_ms=lag_ms,
        )
        task = asyncio.get_running_loop().create_task(self._execute(slot, job, lease))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        seen = self._cancel_seen.get(job.id)
        if seen is not None and time.monotonic() - seen < CANCEL_MEMORY_S:
            self._cancel(job.id)

    async def _execute(self, slot: Any, job: Job, lease: Lease) -> None:
        timeout = job.timeout_s or self.settings.default_timeout_s
        run = RunJob(job_id=job.id, attempt=job.attempts, task=job.task, payload=job.payload)
        started = time.monotonic()
        try:
            try:
                outcome = await self.runner.run(slot, run, timeout)
            finally:
                self._held.pop(job.id, None)
            # The final write must happen even if this task is cancelled during shutdown.
            await asyncio.shield(self._record(job, lease, outcome, time.monotonic() - started))
        finally:
            self._jobs.pop(job.id, None)
            if self._maybe_more or self._stopping:
                self._wake.set()

    async def _record(self, job: Job, lease: Lease, outcome: Outcome, elapsed: float) -> None:
        fields = job_fields(job) | {"duration_ms": round(elapsed * 1000, 2)}
        if outcome.kind == "lease_lost":
            emit(Event.JOB_RESULT_DISCARDED, level="warning", **fields, reason="lease lost")
            return
        if outcome.kind == "timeout":
            emit(Event.JOB_TIMED_OUT, level="warning", **fields, timeout_s=job.timeout_s)
        if outcome.kind == "ok":
            await self._record_completion(job, lease, outcome, fields)
            return
        try:
            done = await self._retrying(
                "record",
                lambda: self._write_outcome(job, lease, outcome),
                deadline=self.settings.lease_seconds * 2,
            )
        except PyMongoError as exc:  # not transient: retrying would fail the same way
            done = await self._store_refused(job, lease, str(exc))
            if done is None:
                return
        except LeaseLost:
            emit(
                Event.JOB_RESULT_DISCARDED,
                level="warning",
                **fields,
                outcome=outcome.kind,
                reason="lease lost: another attempt or owner holds the job",
            )
            return
        if done is None:
            emit(
                Event.JOB_RESULT_DISCARDED,
                level="error",
                **fields,
                outcome=outcome.kind,
                reason="could not record before the deadline; the watchdog will requeue it",
            )
            return
        self._log_outcome(done, outcome, fields)

    async def _record_completion(
        self, job: Job, lease: Lease, outcome: Outcome, fields: dict[str, Any]
    ) -> None:
        try:
            verdict, detail = await self.completer.complete(lease, outcome.result)
        except PyMongoError as exc:  # not transient
            verdict, detail = "refused", str(exc)
        if verdict == "applied":
            emit(Event.JOB_COMPLETED, **fields)
        elif verdict == "lost":
            emit(
                Event.JOB_RESULT_DISCARDED,
                level="warning",
                **fields,
                outcome="ok",
                reason="lease lost: another attempt or owner holds the job",
            )
        elif verdict == "deadline":
            emit(
                Event.JOB_RESULT_DISCARDED,
                level="error",
                **fields,
                outcome="ok",
                reason="could not record before the deadline; the watchdog will requeue it",
            )
        else:
            done = await self._store_refused(job, lease, detail)
            if done is not None:
                self._log_outcome(done, Outcome(kind="error"), fields)

    async def _store_refused(self, job: Job, lease: Lease, message: str) -> Job | None:
        """MongoDB refused the outcome itself (e.g. a result over the document size limit):
        fail the attempt with that error rather than leave the job to lease expiry."""
        emit(
            Event.MONGO_UNAVAILABLE,
            level="error",
            op="record",
            error=message[:300],
            **job_fields(job),
        )
        error = {"type": "ResultNotStored", "message": message[:2000]}
        try:
            return await self.store.fail_attempt(
                lease,
                self.owner,
                error,
                backoff_delay(
                    job.attempts, self.settings.retry_base_seconds, self.settings.retry_cap_seconds
                ),
            )
        except (LeaseLost, PyMongoError):
            return None

    async def _applied_before(self, job: Job, lease: Lease, outcome: Outcome) -> Job | None:
        """A write retried across a failover may have been applied by the first try; the
        retry then finds the job no longer running. Recognise our own write."""
        try:
            now = await self.store.get(job.id)
        except PyMongoError:
            return None
        if now.attempts != lease.attempt or now.status == JobStatus.RUNNING:
            return None
        last = now.history[-1] if now.history else {}
        if last.get("attempt") != lease.attempt:
            return None
        expected_error = (outcome.error or {}).get("type")
        if outcome.kind == "cancelled" and now.status == JobStatus.CANCELLED:
            return now
        if (
            outcome.kind not in ("ok", "cancelled", "shutdown")
            and last.get("error") == expected_error
        ):
            return now
        return None

    async def _write_outcome(self, job: Job, lease: Lease, outcome: Outcome) -> Job:
        """Every outcome but success (completions go through the group-committing completer)."""
        if outcome.kind == "cancelled":
            return await self.store.cancel_running(lease, self.owner)
        if outcome.kind == "shutdown":
            return await self.store.release(lease, self.owner)
        delay = outcome.retry_delay
        if delay is None:
            delay = backoff_delay(
                job.attempts, self.settings.retry_base_seconds, self.settings.retry_cap_seconds
            )
        error = outcome.error or {"type": "Error", "message": outcome.kind}
        return await self.store.fail_attempt(lease, self.owner, error, max(delay, 0.0))

    def _log_outcome(self, done: Job, outcome: Outcome, fields: dict[str, Any]) -> None:
        if done.status == JobStatus.COMPLETED:
            emit(Event.JOB_COMPLETED, **fields)
        elif done.status == JobStatus.CANCELLED:
            emit(Event.JOB_CANCELLED, **fields)
        elif outcome.kind == "shutdown":
            emit(Event.JOB_RELEASED, **fields, reason="dispatcher shutting down")
        elif done.status == JobStatus.PENDING:
            emit(
                Event.JOB_RETRY_SCHEDULED,
                level="warning",
                **fields,
                error_type=(done.error or {}).get("type"),
                run_at=done.run_at.isoformat(),
                max_attempts=done.max_attempts,
            )
        else:
            emit(
                Event.JOB_FAILED,
                level="error",
                **fields,
                error_type=(done.error or {}).get("type"),
                error_message=(done.error or {}).get("message"),
            )

    # -- timer (earliest due job) ---------------------------------------------------------

    async def _arm_timer(self) -> None:
        try:
            due = await self.store.next_due()
        except PyMongoError:
            return
        if due is None:
            return
        at = due.timestamp()
        if at <= self._server_now():
            # Due by our estimate but not claimable: clock estimate off or another dispatcher
            # raced us. Back off a little so this never turns into a busy loop.
            self._empty_claims += 1
            at = self._server_now() + min(0.005 * 2**self._empty_claims, 1.0)
        self._schedule(at)

    def _schedule(self, server_ts: float) -> None:
        if self._timer_at is not None and self._timer_at <= server_ts and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
        delay = max(server_ts - self._server_now(), 0.0)
        loop = asyncio.get_running_loop()
        self._timer_at = server_ts
        self._timer = loop.call_later(delay, self._fire_timer)

    def _fire_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._rearm_timer = True  # after this claim, find the next due time
        self._signal()

    def _server_now(self) -> float:
        return time.time() + self._clock_offset

    # -- heartbeat & watchdog ---------------------------------------------------------------

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            leases = list(self._held.values())
            if not leases:
                continue
            try:
                lost = await self.store.renew(self.owner, leases, self.settings.lease_seconds)
            except PyMongoError as exc:
                emit(Event.MONGO_UNAVAILABLE, level="warning", op="renew", error=str(exc)[:200])
                continue
            for job_id in lost:
                if job_id in self._held:
                    job = self._jobs.get(job_id)
                    emit(
                        Event.LEASE_LOST,
                        level="warning",
                        **(job_fields(job) if job else {"job_id": job_id}),
                        owner=self.owner,
                    )
                    self.runner.kill(job_id, "lease_lost")

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_seconds)
            try:
                await self._sweep()
            except PyMongoError as exc:
                emit(Event.MONGO_UNAVAILABLE, level="warning", op="sweep", error=str(exc)[:200])

    async def _sweep(self) -> None:
        """Requeue expired leases, stop workers of cancelled jobs, and claim due work."""
        await self._sync_clock()
        requeued = 0
        for doc in await self.store.expired():
            delay = backoff_delay(
                doc["attempts"], self.settings.retry_base_seconds, self.settings.retry_cap_seconds
            )
            try:
                job = await self.store.requeue_expired(doc, delay)
            except LeaseLost:
                continue  # renewed or finished meanwhile
            requeued += 1
            emit(
                Event.LEASE_EXPIRED,
                level="warning",
                **job_fields(doc),
                owner=doc["owner"],
                status=job.status.value,
            )
            if doc["owner"] == self.owner:
                self.runner.kill(str(doc["_id"]), "lease_lost")
        if self._held:
            wanted = await self.store.jobs.find(
                {"_id": {"$in": list(self._held)}, "owner": self.owner, "cancel_requested": True},
                projection={"_id": 1},
            ).to_list()
            for doc in wanted:
                self._cancel(str(doc["_id"]))
        now = time.monotonic()
        for job_id, seen in list(self._cancel_seen.items()):
            if now - seen > CANCEL_MEMORY_S:
                del self._cancel_seen[job_id]
        if requeued:
            emit(Event.SWEEP_DONE, requeued=requeued)
        # Claim what no event announced (and find the next due time) — the slow path.
        self._rearm_timer = True
        self._signal()

    async def _sync_clock(self) -> None:
        before = time.time()
        server = await self.store.server_now()
        after = time.time()
        self._clock_offset = (
            server.replace(tzinfo=server.tzinfo or UTC).timestamp() - (before + after) / 2
        )

    async def _retrying(self, op: str, fn: Any, deadline: float = float("inf")) -> Any:
        """Run `fn` until it succeeds, riding out a failover; None if `deadline` passes."""
        start = time.monotonic()
        delay = 0.1
        while True:
            try:
                return await fn()
            except PyMongoError as exc:
                if not is_transient(exc):
                    raise
                if time.monotonic() - start > deadline:
                    return None
                emit(Event.MONGO_UNAVAILABLE, level="warning", op=op, error=str(exc)[:200])
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
