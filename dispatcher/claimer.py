"""Claiming: look for due work only when there may be some, and lease it in batches.

Reasons to look (an insert or requeue seen on the stream, the due-job timer, a sweep, a
freed worker) are counted as signals; the claimer loop claims while a slot is free and the
last look may have left due work behind. A future `run_at` arms one timer, on the server's
clock, for the earliest due job.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime

from pymongo.errors import PyMongoError

from common.events import Event, emit
from common.metrics import CLAIMS, JOB_WAIT
from common.models import Job
from common.runner import Runner, Slot
from common.settings import Settings
from common.store import JobStore
from dispatcher.holdings import Holdings

MAX_BATCH = 64

StartJob = Callable[[Slot, Job], None]


def _claimed(job: Job) -> None:
    CLAIMS.inc()
    if job.started_at is not None:  # both times are the server's
        JOB_WAIT.observe(max((job.started_at - job.run_at).total_seconds(), 0.0))


class ServerClock:
    """The server's clock as seen from here: local time plus a measured offset."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.offset = 0.0  # server clock - local clock, seconds

    def now(self) -> float:
        return time.time() + self.offset

    async def sync(self) -> None:
        before = time.time()
        server = await self.store.server_now()
        after = time.time()
        self.offset = server.replace(tzinfo=server.tzinfo or UTC).timestamp() - (before + after) / 2


class DueTimer:
    """One timer for the earliest due job; firing it is a reason to look for work."""

    def __init__(self, store: JobStore, clock: ServerClock, fire: Callable[[], None]) -> None:
        self.store = store
        self.clock = clock
        self.fire = fire
        self.rearm = True  # after the next empty look, ask the store for the next due time
        self._handle: asyncio.TimerHandle | None = None
        self._at: float | None = None
        self._misses = 0

    def at(self, server_ts: float) -> None:
        if self._at is not None and self._at <= server_ts and self._handle is not None:
            return  # an earlier timer is armed already
        self.cancel()
        self._at = server_ts
        delay = max(server_ts - self.clock.now(), 0.0)
        self._handle = asyncio.get_running_loop().call_later(delay, self._fired)

    async def arm_for_next_due(self) -> None:
        self.rearm = False
        try:
            due = await self.store.next_due()
        except PyMongoError:
            return  # the sweep re-arms it
        if due is None:
            return
        at = due.timestamp()
        if at <= self.clock.now():
            # Due by our estimate but not claimable: clock estimate off or another dispatcher
            # raced us. Back off a little so this never turns into a busy loop.
            self._misses += 1
            at = self.clock.now() + min(0.005 * 2**self._misses, 1.0)
        else:
            self._misses = 0
        self.at(at)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._at = None

    def _fired(self) -> None:
        self._handle = None
        self._at = None
        self.rearm = True
        self.fire()


class Claimer:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        owner: str,
        runner: Runner,
        holdings: Holdings,
        clock: ServerClock,
        start: StartJob,
    ) -> None:
        self.settings = settings
        self.store = store
        self.owner = owner
        self.runner = runner
        self.holdings = holdings
        self.start = start
        self.timer = DueTimer(store, clock, self.signal)
        self.clock = clock
        self._wake = asyncio.Event()
        self._stopping = False
        # `_signals` counts reasons to look for work; `_maybe_more` says the last look may
        # have left due work behind.
        self._signals = 0
        self._maybe_more = True
        self._batch = 1

    def signal(self) -> None:
        """There may be due work: look for it."""
        self._signals += 1
        self._maybe_more = True
        self._wake.set()

    def due_at(self, run_at: datetime | None) -> None:
        """A job became pending: look now, or when it is due."""
        if run_at is not None and run_at.timestamp() > self.clock.now() + 0.002:
            self.timer.at(run_at.timestamp())
        else:
            self.signal()

    def sweep_done(self) -> None:
        """The slow path looked too: claim what no event announced, re-arm the timer."""
        self.timer.rearm = True
        self.signal()

    def slot_freed(self) -> None:
        if self._maybe_more or self._stopping:
            self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self.timer.cancel()
        self._wake.set()

    async def run(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            while not self._stopping and self._maybe_more:
                if not await self._look():
                    break

    async def _look(self) -> bool:
        """Claim once for the free room; False when there is no room to fill."""
        # A lease counts against the concurrency until its final write is done, so the
        # jobs collection never shows more running jobs than there are slots.
        room = min(self.settings.concurrency - self.holdings.count(), self.runner.free_slots())
        if room <= 0:
            return False  # a finished job or a ready worker wakes us again
        seen = self._signals
        # Claims in flight together overlap their round trips. Start with one and double
        # while every claim finds a job (a backlog); one event then costs one claim.
        n = min(room, self._batch)
        got = [await self._claim_one()] if n == 1 else await self._claim_batch(n)
        self._batch = min(self._batch * 2, MAX_BATCH) if all(got) else 1
        if False in got and None not in got:
            return True  # lost races to another dispatcher: there is more, look again
        if None in got:
            if self._signals == seen:
                self._maybe_more = False  # nothing due, and no news meanwhile
            if self.timer.rearm:
                await self.timer.arm_for_next_due()
            if got.count(True) == 0 and self._maybe_more:
                await asyncio.sleep(0)  # let the news that raced us land
        return True

    async def _claim_batch(self, n: int) -> list[bool | None]:
        """Claim up to `n` jobs in one write; True per job started, None for a slot the
        queue could not fill, False for one lost to another dispatcher's race."""
        slots = [slot for slot in (self.runner.reserve() for _ in range(n)) if slot is not None]
        try:
            jobs, dry = await self.store.claim_many(
                self.owner, self.settings.lease_seconds, len(slots)
            )
        except PyMongoError as exc:
            await self._claim_failed(slots, exc)
            return [False]
        for slot, job in zip(slots, jobs, strict=False):
            _claimed(job)
            self.start(slot, job)
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
        _claimed(job)
        self.start(slot, job)
        return True

    async def _claim_failed(self, slots: list[Slot], exc: PyMongoError) -> None:
        """No primary (or similar): give the slots back, wait a little, look again."""
        for slot in slots:
            self.runner.unreserve(slot)
        emit(Event.MONGO_UNAVAILABLE, level="warning", op="claim", error=str(exc)[:200])
        await asyncio.sleep(0.5)
        self.signal()
