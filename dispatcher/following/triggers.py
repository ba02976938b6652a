"""Triggers: one job per matching change in an application's collection, once for the cluster.

Every dispatcher that loaded a trigger runs a `TriggerFollower` for it, but only one at a
time follows it: the one holding its lease in `brook_triggers` (taken and renewed on the
server's clock, `$$NOW`, by majority writes). The others try to take it every second or
so; a dead follower's lease runs out `BROOK_LEASE_SECONDS` after its last renewal, and the
next one goes on from the saved resume token. A stopping follower gives its lease up.

Exactly one job per change, whatever dies when:
  * each job's idempotency key is the trigger's name and the change's own id (its resume
    token, the same on every member): a change seen again makes no second job;
  * the token is saved only after the jobs of every change up to it are submitted (one
    majority `insert_many` per batch, then one majority write of the token), never before;
    so a follower that dies between the two leaves the next one a token from before those
    changes, and their jobs come back as the existing ones;
  * every save is fenced by the follower's id: one that froze past its lease saves nothing
    when it wakes, and stops following (`trigger.lease_lost`).

A poison change cannot stop it. A change that cannot become a job (it cannot be read, its
job would be too large, MongoDB refuses the job, its payload cannot be built) is skipped:
counted in `skipped` by the same save that moves the token past it (so once, whoever dies
when), then logged (`trigger.change_skipped`, with its id and the reason). The changes
around it make their jobs as ever. Any other failure is logged (`trigger.error`) and
retried from the saved token after a pause: it never fails the dispatcher.

Pausing keeps the lease and the token and reads nothing; resuming reads on from the token,
so the changes made meanwhile make their jobs (as far as the oplog still holds them). A
token the oplog no longer holds is said once (`trigger.history_lost`, the
`brook_trigger_history_lost` metric, `history_lost` on `GET /triggers`), and the trigger goes
on from now.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bson.raw_bson import RawBSONDocument
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.errors import OperationFailure, PyMongoError

from brook.common.domain.models import Doc, JobSpec
from brook.common.domain.triggers import (
    MAX_JOB_BYTES,
    SkippedChange,
    Trigger,
    TriggerState,
    change_key,
    change_payload,
    document_id,
    token_time,
)
from brook.common.runtime import tracing
from brook.common.runtime.backoff import Backoff
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.runtime.metrics import TRIGGER_HISTORY_LOST, TRIGGER_JOBS, TRIGGER_SKIPPED
from brook.common.store.db import is_history_lost
from brook.common.store.failover_retry import persist
from brook.common.store.jobs import JobStore, Refused, buffered
from brook.common.store.pipelines import INVALIDATING
from brook.common.store.triggers import TriggerStore, plain_token, read_change

BATCH = 500  # changes per submit at most
SAVE_EVERY_S = 1.0  # an idle stream's newer token is saved at most this often
MAX_RENEW_S = 2.0  # the lease is renewed (and `paused` read) at least this often
MAX_POLL_S = 1.0  # a standby tries to take the lease at least this often


class FollowerDisplaced(Exception):
    """Another follower holds the trigger now."""


# What the stream gave: a change, decoded, or one to skip.
Change = Doc | SkippedChange


def _operation(change: Change) -> str | None:
    if isinstance(change, SkippedChange):
        return change.operation
    op = change.get("operationType")
    return op if isinstance(op, str) else None


@dataclass(frozen=True, kw_only=True)
class Made:
    """What a batch of changes came to: how many have their job, those skipped, and the
    cluster time of the last change with a job."""

    jobs: int
    skipped: Sequence[SkippedChange]
    last_change_at: datetime | None


NOTHING_MADE = Made(jobs=0, skipped=(), last_change_at=None)


class TriggerJobs:
    """The jobs of a trigger's changes: one per change, in one write; a change that cannot
    have one (unreadable, too large, refused by MongoDB, no payload) is skipped instead."""

    def __init__(self, trigger: Trigger, jobs: JobStore) -> None:
        self.trigger = trigger
        self.jobs = jobs

    async def submit(self, changes: Sequence[Change]) -> Made:
        """Submit one job per change (one majority write): how many changes now have their
        job, those that cannot have one, and the cluster time of the last with a job. Every
        one counts, those whose job a follower that died before saving its token had made
        already included: the counts move with the token, in the same write, so each
        change is counted by the one save that moves the token past it."""
        skipped: list[SkippedChange] = []
        ready: list[tuple[Doc, JobSpec]] = []
        for change in changes:
            if isinstance(change, SkippedChange):
                skipped.append(change)
                continue
            try:
                ready.append((change, self.spec(change)))
            except Exception as exc:  # the change is not what a job is made from
                reason = f"no payload: {type(exc).__name__}: {exc}"[:500]
                skipped.append(self._skipped(change, reason))
        if not ready:
            return Made(jobs=0, skipped=skipped, last_change_at=None)
        specs = [spec for _, spec in ready]
        results = await persist(
            "trigger.submit", lambda: self.jobs.submit_or_refuse(specs, MAX_JOB_BYTES)
        )
        submitted = []
        last: datetime | None = None
        for (change, _), result in zip(ready, results, strict=True):
            if isinstance(result, Refused):
                skipped.append(self._skipped(change, result.reason))
            else:
                submitted.append(result)
                last = change.get("wallTime")
        new, name = 0, self.trigger.name
        for s in submitted:
            if s.created:
                new += 1
                log_event(Event.JOB_SUBMITTED, **job_fields(s.job), queue=s.job.queue, trigger=name)
            else:  # a change replayed after a takeover: its job exists
                log_event(Event.JOB_DEDUPLICATED, level="debug", **job_fields(s.job), trigger=name)
        if new:
            TRIGGER_JOBS.labels(trigger=name).inc(new)
        return Made(jobs=len(submitted), skipped=skipped, last_change_at=last)

    @staticmethod
    def _skipped(change: Doc, reason: str) -> SkippedChange:
        return SkippedChange(
            change_id=str(change["_id"]["_data"]),
            operation=_operation(change),
            document_id=document_id(change),
            reason=reason,
        )

    def spec(self, change: Doc) -> JobSpec:
        t = self.trigger
        trace = None
        if tracing.active():
            # A span for the change, the job's parent: its run continues this trace.
            with tracing.span(
                f"brook.trigger {t.name}",
                kind="CONSUMER",
                attributes={
                    "brook.trigger": t.name,
                    "brook.operation": change["operationType"],
                    "brook.change_id": change["_id"]["_data"],
                    "db.collection.name": t.collection,
                    "brook.document_key": str((change.get("documentKey") or {}).get("_id")),
                },
            ):
                trace = tracing.inject()
        return JobSpec(
            task=t.task,
            payload=change_payload(t, change),
            queue=t.queue,
            max_attempts=t.max_attempts,
            idempotency_key=change_key(t.name, change["_id"]),
            trigger={
                "name": t.name,
                "operation": change["operationType"],
                "change_id": change["_id"]["_data"],
            },
            trace=trace,
        )


class TriggerFollower:
    def __init__(
        self,
        trigger: Trigger,
        jobs: JobStore,
        store: TriggerStore,
        owner: str,
        lease_seconds: float,
        *,
        max_await_ms: int = 1000,
    ) -> None:
        self.trigger = trigger
        self.made = TriggerJobs(trigger, jobs)
        self.store = store
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.renew_s = min(lease_seconds / 3, MAX_RENEW_S)
        self.poll_s = min(lease_seconds / 5, MAX_POLL_S)
        self.max_await_ms = max_await_ms
        self.leading = False
        # The token whose changes all have their jobs, as last saved, and when it was saved.
        self._token: Mapping[str, Any] | None = None
        self._start_at: Any = None
        self._saved_at = 0.0
        self._renewed = 0.0

    @property
    def name(self) -> str:
        return self.trigger.name

    async def run(self) -> None:
        while True:
            state = await self._acquire()
            self.leading = True
            log_event(
                Event.TRIGGER_FOLLOWING,
                trigger=self.name,
                owner=self.owner,
                token=state.token is not None,
                paused=state.paused,
            )
            try:
                await self._lead(state)
            except FollowerDisplaced:
                self.leading = False
                log_event(
                    Event.TRIGGER_LEASE_LOST, level="warning", trigger=self.name, owner=self.owner
                )

    async def release(self) -> None:
        """Give the lease up (at shutdown, once `run` was cancelled: it could take the lease
        again), so another dispatcher follows on at once."""
        if self.leading:
            await self.store.release(self.name, self.owner)
            log_event(Event.TRIGGER_RELEASED, trigger=self.name, owner=self.owner)

    async def _acquire(self) -> TriggerState:
        while True:
            try:
                state = await self.store.acquire(self.name, self.owner, self.lease_seconds)
                if state is not None:
                    return state
            except PyMongoError as exc:
                error = str(exc)[:200]
                log_event(
                    Event.MONGO_UNAVAILABLE, level="warning", op="trigger.acquire", error=error
                )
            except Exception as exc:  # its document, written by hand, cannot be read
                log_event(
                    Event.TRIGGER_ERROR,
                    level="error",
                    trigger=self.name,
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
            await asyncio.sleep(self.poll_s)

    async def _checkpoint(
        self,
        token: Mapping[str, Any] | None = None,
        made: int = 0,
        last_change_at: datetime | None = None,
        skipped: Sequence[SkippedChange] = (),
    ) -> TriggerState:
        """Renew the lease (and save `token`, whose changes all have their jobs or are
        `skipped`); through a failover. `FollowerDisplaced` if another follower holds it
        now."""
        state = await persist(
            "trigger.checkpoint",
            lambda: self.store.checkpoint(
                self.name,
                self.owner,
                self.lease_seconds,
                token=token,
                handled_through=token_time(token),
                made=made,
                last_change_at=last_change_at,
                skipped=skipped,
            ),
        )
        if state is None:
            raise FollowerDisplaced(self.name)
        self._renewed = time.monotonic()
        if token is not None:
            self._token, self._saved_at = token, self._renewed
        return state

    async def _lead(self, state: TriggerState) -> None:
        self._token, self._start_at = state.token, state.start_at
        self._renewed = time.monotonic()
        backoff = Backoff(0.1, 5.0)
        idle = False
        while True:
            if state.paused:
                if not idle:  # said once a pause: it reads nothing until resumed
                    log_event(Event.TRIGGER_IDLE, trigger=self.name, owner=self.owner)
                    idle = True
                await asyncio.sleep(self.renew_s)
                state = await self._checkpoint()
                continue
            idle = False
            try:
                state = await self._follow(backoff) or await self._checkpoint()
            except OperationFailure as exc:
                if is_history_lost(exc):
                    state = await self._history_lost(exc)
                    continue
                log_event(
                    Event.TRIGGER_ERROR,
                    level="warning",
                    trigger=self.name,
                    code=exc.code,
                    error=str(exc)[:300],
                )
                await asyncio.sleep(backoff.next())
                state = await self._checkpoint()
            except PyMongoError as exc:
                log_event(
                    Event.TRIGGER_ERROR, level="warning", trigger=self.name, error=str(exc)[:300]
                )
                await asyncio.sleep(backoff.next())
                state = await self._checkpoint()
            except FollowerDisplaced:
                raise
            except Exception as exc:  # a bug, or a failure no change can be blamed for
                # Not the dispatcher's end, nor a reason to skip changes that may be good:
                # said loudly, and tried again from the saved token.
                log_event(
                    Event.TRIGGER_ERROR,
                    level="error",
                    trigger=self.name,
                    error=f"{type(exc).__name__}: {exc}"[:300],
                    exc_info=True,
                )
                await asyncio.sleep(backoff.next())
                state = await self._checkpoint()

    async def _history_lost(self, exc: OperationFailure) -> TriggerState:
        # Recorded first, then said: whoever reads the trigger after the log line or the
        # metric finds `history_lost` counted (a leader that lost its lease says nothing;
        # the next one finds the token gone too and says it).
        state = await persist(
            "trigger.history_lost", lambda: self.store.lost_history(self.name, self.owner)
        )
        if state is None:
            raise FollowerDisplaced(self.name)
        TRIGGER_HISTORY_LOST.labels(trigger=self.name).inc()
        log_event(
            Event.TRIGGER_HISTORY_LOST,
            level="warning",
            trigger=self.name,
            code=exc.code,
            error=str(exc)[:300],
            resumes="from now: changes the oplog no longer held made no job",
        )
        self._token = self._start_at = None
        return state

    async def _follow(self, backoff: Backoff) -> TriggerState | None:
        """Follow the stream from the saved token until the trigger is paused (its state
        returned) or the stream ends (an invalidation: its token is saved, and the caller
        opens the stream again after it; None)."""
        async with await self.store.changes(
            self.trigger,
            start_after=self._token,
            start_at=self._start_at,
            max_await_ms=self.max_await_ms,
        ) as stream:
            log_event(
                Event.TRIGGER_OPENED,
                trigger=self.name,
                collection=self.trigger.collection,
                db=self.trigger.db,
                resumed=self._token is not None,
            )
            if self._token is None:  # from a start time or from now: save where it stands
                await self._checkpoint(plain_token(stream.resume_token) or None)
            while stream.alive:
                changes = await self._collect(stream)
                state = await self._handle(changes, plain_token(stream.resume_token))
                backoff.reset()
                if state is not None and state.paused:
                    return state
        return None

    async def _collect(self, stream: AsyncChangeStream[RawBSONDocument]) -> list[Change]:
        """The changes the stream holds now (one getMore's worth, up to BATCH), or none
        after waiting up to `max_await_ms`; each decoded, or to skip."""
        changes: list[Change] = []
        while len(changes) < BATCH:
            raw = await stream.try_next()
            if raw is None:
                break
            change = read_change(raw)
            changes.append(change)
            if _operation(change) in INVALIDATING or buffered(stream) == 0:
                break
        return changes

    async def _handle(
        self, changes: Sequence[Change], token: Mapping[str, Any] | None
    ) -> TriggerState | None:
        """Submit the jobs of `changes`, then save `token` (just past them); or, with none,
        save a newer token now and then and renew the lease. The state it wrote, if any."""
        wanted = [c for c in changes if _operation(c) in self.trigger.operations]
        for change in changes:
            if (op := _operation(change)) in INVALIDATING:
                log_event(
                    Event.TRIGGER_INVALIDATED,
                    level="warning",
                    trigger=self.name,
                    op=op,
                    collection=self.trigger.collection,
                )
        if wanted and time.monotonic() - self._renewed >= self.renew_s:
            # Stalled (frozen, paged out) since its last renewal: the lease may have passed
            # to another follower. Renewed first (FollowerDisplaced if so): a zombie makes
            # no job after waking.
            await self._checkpoint()
        made = await self.made.submit(wanted) if wanted else NOTHING_MADE
        now = time.monotonic()
        newer = token is not None and token != self._token
        if changes or (newer and now - self._saved_at >= SAVE_EVERY_S):
            state = await self._checkpoint(token, made.jobs, made.last_change_at, made.skipped)
            self._said_skipped(made.skipped)
            return state
        if now - self._renewed >= self.renew_s:
            return await self._checkpoint()
        return None

    def _said_skipped(self, skipped: Sequence[SkippedChange]) -> None:
        """Say what the save just counted (once: a follower that died before its save said
        nothing of them, and the next one skips and says them again)."""
        for change in skipped:
            log_event(
                Event.TRIGGER_CHANGE_SKIPPED,
                level="error",
                trigger=self.name,
                change_id=change.change_id,
                operation=change.operation,
                document_id=change.document_id,
                reason=change.reason,
            )
        if skipped:
            TRIGGER_SKIPPED.labels(trigger=self.name).inc(len(skipped))


class TriggerRunner:
    """The dispatcher's triggers: declared once at start, then one follower each."""

    def __init__(
        self,
        triggers: Sequence[Trigger],
        jobs: JobStore,
        owner: str,
        lease_seconds: float,
    ) -> None:
        self.triggers = list(triggers)
        self.store = TriggerStore(jobs.db)
        self.owner = owner
        self.followers = [
            TriggerFollower(t, jobs, self.store, owner, lease_seconds) for t in self.triggers
        ]
        self._running: list[asyncio.Future[None]] = []

    async def run(self) -> None:
        if not self.triggers:
            return
        await persist("triggers.declare", lambda: self.store.declare(self.triggers, self.owner))
        for t in self.triggers:
            log_event(
                Event.TRIGGER_DECLARED,
                trigger=t.name,
                collection=t.collection,
                db=t.db,
                operations=list(t.operations),
                task=t.task,
            )
        self._running = [asyncio.ensure_future(f.run()) for f in self.followers]
        await asyncio.gather(*self._running)

    async def release(self) -> None:
        """Stop following, then give every lease held up."""
        for task in self._running:
            task.cancel()
        if self._running:
            await asyncio.wait(self._running, timeout=0.2)
        await asyncio.gather(*(f.release() for f in self.followers), return_exceptions=True)
