"""Durable steps and suspensions, as the dispatcher holding the lease writes them.

A running attempt's worker sends each finished step up its pipe (`StepRecord`) and waits.
Here it is written, fenced by attempt and owner like a completion (`JobStore.record_step`),
riding out a failover within the lease; the worker hears `StepAck` only once the write is
majority-acknowledged, so a step that returned in the task is never run again. A zombie
(a dispatcher that lost its lease while frozen) writes nothing: its fence matches nothing,
and its worker is told the lease is lost. A sleep's step gets its wake time here, from the
server's clock as this dispatcher reads it.

An attempt that ended to sleep or wait (`Outcome.suspend`) is written back to pending until
its wake time (`JobStore.suspend`); a signal wait then looks for a signal already sent on
its key, and wakes the job if one is there (the sender wakes only jobs already waiting:
whichever of the two writes second sees the other's).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo.errors import PyMongoError

from brook.common.domain.errors import QuotaNotFound
from brook.common.domain.models import Job, whole_ms
from brook.common.protocol.runner import StepAck, StepRecord, Suspend
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.metrics import STEPS
from brook.common.runtime.supervision import Spawn
from brook.common.store.clock import ServerClock
from brook.common.store.failover_retry import ride_out
from brook.common.store.jobs import JobStore, Lease
from brook.common.store.quotas import QuotaStore
from brook.common.store.signals import SignalStore


class StepKeeper:
    def __init__(
        self,
        store: JobStore,
        owner: str,
        clock: ServerClock,
        lease_seconds: float,
        spawn: Spawn,
    ) -> None:
        self.store = store
        self.quotas = QuotaStore(store.db)
        self.owner = owner
        self.clock = clock
        self.lease_seconds = lease_seconds
        self._spawn = spawn
        self.signals = SignalStore(store.db)

    def record(self, step: StepRecord, reply: Callable[[StepAck], None]) -> None:
        """A worker finished a step (called by the runner): write it, then answer."""
        self._spawn(self._record(step, reply), f"step:{step.job_id}")

    async def _record(self, step: StepRecord, reply: Callable[[StepAck], None]) -> None:
        fields: dict[str, Any] = {
            "job_id": step.job_id,
            "attempt": step.attempt,
            "task": step.task,
            "step": step.name,
        }
        result = step.result
        if step.wake_in_s is not None:
            result = whole_ms(await self.clock.read() + timedelta(seconds=step.wake_in_s))
        lease = Lease(job_id=step.job_id, attempt=step.attempt)
        until = time.monotonic() + self.lease_seconds
        try:
            written = await ride_out(
                "step",
                lambda: self.store.record_step(
                    lease, self.owner, step.name, result, step.size, step.duration_ms
                ),
                until=until,
            )
        except PyMongoError as exc:  # not transient: refused
            log_event(Event.MONGO_REFUSED, level="error", op="step", error=str(exc)[:300], **fields)
            reply(_ack(step, ok=False, error=f"MongoDB refused it: {str(exc)[:500]}"))
            return
        if written == "recorded":
            log_event(Event.STEP_RECORDED, **fields, size=step.size)
            STEPS.labels(task=step.task, how="run").inc()
            reply(_ack(step, ok=True, result=result))
        elif written == "lost":
            log_event(Event.STEP_DISCARDED, level="warning", **fields, reason="lease lost")
            reply(_ack(step, ok=False, error="lease lost"))
        else:
            reply(_ack(step, ok=False, error="no primary in time"))

    def count(self, job: Job, replayed: int, committed: int) -> None:
        """What an attempt's worker counted: steps replayed, and transactional steps it
        committed itself (the others are counted as they are written, here)."""
        if replayed:
            STEPS.labels(task=job.task, how="replayed").inc(replayed)
        if committed:
            STEPS.labels(task=job.task, how="run").inc(committed)

    async def suspend(self, job: Job, lease: Lease, suspend: Suspend) -> Job:
        """The attempt ended to wait: the job back to pending until its wake time; a wait
        whose signal was sent meanwhile is woken at once. Raises `LeaseLost`."""
        until = suspend.until
        if suspend.waiting.get("kind") == "quota":
            until = await self._close_quota(job, lease, suspend.waiting)
        done = await self.store.suspend(lease, self.owner, until, suspend.waiting)
        key = suspend.waiting.get("key")
        if suspend.waiting.get("kind") == "signal" and isinstance(key, str):
            sent, _ = await self.signals.get(key)
            if sent and await self.store.wake_signal_waiters(key, job.id):
                log_event(Event.JOB_WOKEN, job_id=job.id, task=job.task, key=key)
        return done

    async def _close_quota(self, job: Job, lease: Lease, waiting: dict[str, Any]) -> datetime:
        """A task's `RateLimited`: its quota closed for every dispatcher until `delay` from
        now on the server's clock (the adaptive rule lowers its rate on repeats); the job
        is due then."""
        name, delay = str(waiting["name"]), float(waiting.get("delay", 0.0))
        try:
            quota = await self.quotas.rate_limited(name, delay, (lease.job_id, lease.attempt))
        except QuotaNotFound:
            return datetime.fromtimestamp(self.clock.now() + delay, UTC)
        assert quota.closed_until is not None
        log_event(
            Event.QUOTA_CLOSED,
            job_id=job.id,
            task=job.task,
            quota=name,
            until=quota.closed_until,
            effective_rate=round(quota.factor, 4),
        )
        return quota.closed_until


def _ack(step: StepRecord, *, ok: bool, result: object = None, error: str | None = None) -> StepAck:
    return StepAck(
        job_id=step.job_id,
        attempt=step.attempt,
        name=step.name,
        ok=ok,
        result=result,
        error=error,
    )
