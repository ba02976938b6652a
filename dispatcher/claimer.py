"""Claiming: look for due work only when there may be some, and lease it in batches.

Reasons to look (an insert or requeue seen on the stream, the due-job timer, a sweep, a
freed worker) are counted as signals; the claimer loop claims while a slot is free and the
last look may have left due work behind. A future `run_at` arms one timer, on the server's
clock, for the earliest due job.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

from pymongo.errors import PyMongoError

from common.events import Event, emit
from common.metrics import CLAIMS, JOB_WAIT
from common.models import Job
from common.runner import Runner, Slot
from common.settings import Settings
from common.store import JobStore
from dispatcher.holdings import Holdings
from dispatcher.limits import Limits

MAX_BATCH = 64

StartJob = Callable[[Slot, Job], None]
NextDue = Callable[[], Awaitable[datetime | None]]
# A claim's target: one queue, or None for "every queue" (BROOK_QUEUES unset).
Target = str | None


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

    def __init__(self, next_due: NextDue, clock: ServerClock, fire: Callable[[], None]) -> None:
        self.next_due = next_due
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
            due = await self.next_due()
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
    """Claims only jobs whose task this dispatcher runs, in the queues it serves: with
    `BROOK_QUEUES`, each queue up to its own slots; without, every queue within the
    concurrency. A queue with cluster-wide limits is its own target, claimed through its
    slots (`dispatcher.limits`); the plain claims leave it out."""

    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        owner: str,
        runner: Runner,
        holdings: Holdings,
        clock: ServerClock,
        start: StartJob,
        tasks: frozenset[str],
        limits: Limits,
    ) -> None:
        self.settings = settings
        self.store = store
        self.owner = owner
        self.runner = runner
        self.holdings = holdings
        self.start = start
        self.tasks = tasks
        self.queues: Mapping[str, int] | None = settings.queues
        self.limits = limits
        limits.on_open = self._limits_opened
        self.timer = DueTimer(self._next_due, clock, self.signal)
        self.clock = clock
        self._wake = asyncio.Event()
        self._stopping = False
        # `_signals` counts reasons to look for work; `_maybe_more` says the last look may
        # have left due work behind; `_dry` holds the targets found empty since the last
        # reason to look.
        self._signals = 0
        self._maybe_more = True
        self._dry: set[Target] = set()
        self._batch = 1

    def runs(self, task: object, queue: object) -> bool:
        """Whether a job of this task in this queue is one this dispatcher would claim."""
        served = self.queues is None or queue in self.queues
        return task in self.tasks and served

    @property
    def _targets(self) -> set[Target]:
        if self.queues:
            return set(self.queues)
        return {None, *self.limits.limited()}

    def _target_of(self, queue: str) -> Target:
        return queue if self.queues or self.limits.is_limited(queue) else None

    def signal(self, queue: str | None = None) -> None:
        """There may be due work (in `queue`, when known): look for it."""
        self._signals += 1
        self._maybe_more = True
        if queue is None:
            self._dry.clear()
        else:
            self._dry.discard(self._target_of(queue))
        self._wake.set()

    def due_at(self, run_at: datetime | None, queue: str | None = None) -> None:
        """A job became pending (in `queue`, when known): look now, or when it is due."""
        if queue is not None:
            self.limits.saw(queue)
        if run_at is not None and run_at.timestamp() > self.clock.now() + 0.002:
            self.timer.at(run_at.timestamp())
        else:
            self.signal(queue)

    def _limits_opened(self, queue: str | None) -> None:
        """A limited queue may start jobs again (None: the limits changed): its due jobs
        count for the timer again, and it is looked at."""
        self.timer.rearm = True
        self.signal(queue)

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

    async def _next_due(self) -> datetime | None:
        closed = self.limits.closed()
        # Jobs already due in a closed queue wait for it to open, not for a timer: start
        # the search just before now, so such a backlog is not even scanned.
        after = datetime.fromtimestamp(self.clock.now() - 1.0, UTC) if closed else None
        return await self.store.next_due(
            tasks=self.tasks, queues=self.queues, exclude=closed, after=after
        )

    def _room(self, target: Target) -> int:
        """Free room for a target. A lease counts against its slots until its final write
        is done, so the jobs collection never shows more running jobs than there are slots.
        Without `BROOK_QUEUES`, the limited queues share the one room."""
        free = self.runner.free_slots()
        if self.queues is None:
            return min(self.settings.worker_slots - self.holdings.count(), free)
        assert target is not None
        return min(self.queues[target] - self.holdings.count(target), free)

    def _rooms(self) -> list[Target]:
        """Targets to look at: room, news of work, and (a limited queue) a slot may be free."""
        return [
            t
            for t in self._targets
            if t not in self._dry and (t is None or self._may_claim(t)) and self._room(t) > 0
        ]

    def _may_claim(self, queue: str) -> bool:
        return not self.limits.is_limited(queue) or self.limits.may_claim(queue)

    async def _look(self) -> bool:
        """Claim once for the free room; False when there is no room to fill."""
        targets = self._rooms()
        if not targets:
            # No room, or room only in targets found empty or closed: a finished job, a
            # ready worker, news of work or an open limited queue wakes us again.
            return False
        seen = self._signals
        results: dict[Target, list[bool | None]] = {}
        for target in targets:
            room = self._room(target)  # the claims before this one took some
            if room > 0:
                results[target] = await self._claim_for(target, room)
        if not results:
            return False
        filled = all(all(got) for got in results.values())
        self._batch = min(self._batch * 2, MAX_BATCH) if filled else 1
        if self._signals == seen:  # news while we claimed: a dry target may not be dry
            self._dry.update(t for t, got in results.items() if None in got)
        if any(None not in got for got in results.values()):
            return True  # a target filled its room or lost races: there may be more
        closed = {t for t in self._targets if t is not None and not self._may_claim(t)}
        if self._signals == seen and self._dry | closed >= self._targets:
            self._maybe_more = False  # nothing due anywhere it may start, and no news meanwhile
        if self.timer.rearm:
            await self.timer.arm_for_next_due()
        if not any(True in got for got in results.values()) and self._maybe_more:
            await asyncio.sleep(0)  # let the news that raced us land
        return True

    async def _claim_for(self, target: Target, room: int) -> list[bool | None]:
        if target is not None and self.limits.is_limited(target):
            return await self._claim_limited(target, min(room, MAX_BATCH))
        # Claims in flight together overlap their round trips. Start with one and double
        # while every claim finds a job (a backlog); one event then costs one claim.
        n = min(room, self._batch)
        return [await self._claim_one(target)] if n == 1 else await self._claim_batch(target, n)

    async def _claim_limited(self, queue: str, n: int) -> list[bool | None]:
        """Claim up to `n` jobs of a limited queue through its slots (one write for all)."""
        slots = [slot for slot in (self.runner.reserve() for _ in range(n)) if slot is not None]
        if not slots:
            return [False]
        try:
            got = await self.limits.claim(queue, len(slots), self.tasks)
        except PyMongoError as exc:
            await self._claim_failed(slots, exc)
            return [False]
        for slot, job in zip(slots, got.jobs, strict=False):
            _claimed(job)
            self.start(slot, job)
        for slot in slots[len(got.jobs) :]:
            self.runner.unreserve(slot)
        await self.limits.settle(got)
        unfilled: bool | None = None if got.dry or got.blocked else False
        return [True] * len(got.jobs) + [unfilled] * (len(slots) - len(got.jobs))

    async def _scope(self, target: Target) -> tuple[frozenset[str], frozenset[str] | None]:
        """For a claim across every queue: the limited queues to leave out, and the queues
        it may take from (None: any)."""
        if target is not None:
            return frozenset(), None
        return self.limits.limited(), await self.limits.plain_queues()

    async def _claim_batch(self, target: Target, n: int) -> list[bool | None]:
        """Claim up to `n` jobs in one write; True per job started, None for a slot the
        queue could not fill, False for one lost to another dispatcher's race."""
        slots = [slot for slot in (self.runner.reserve() for _ in range(n)) if slot is not None]
        try:
            exclude, among = await self._scope(target)
            jobs, dry = await self.store.claim_many(
                self.owner,
                self.settings.lease_seconds,
                len(slots),
                tasks=self.tasks,
                queue=target,
                exclude=exclude,
                among=among,
            )
        except PyMongoError as exc:
            await self._claim_failed(slots, exc)
            return [False]
        self.limits.adopt_strays(jobs)
        for slot, job in zip(slots, jobs, strict=False):
            _claimed(job)
            self.start(slot, job)
        for slot in slots[len(jobs) :]:
            self.runner.unreserve(slot)
        unfilled: bool | None = None if dry else False
        return [True] * len(jobs) + [unfilled] * (len(slots) - len(jobs))

    async def _claim_one(self, target: Target) -> bool | None:
        """Claim and start one job; True if one started, None if nothing was due."""
        slot = self.runner.reserve()
        if slot is None:
            return False
        try:
            exclude, among = await self._scope(target)
            job = await self.store.claim(
                self.owner,
                self.settings.lease_seconds,
                tasks=self.tasks,
                queue=target,
                exclude=exclude,
                among=among,
            )
        except PyMongoError as exc:
            await self._claim_failed([slot], exc)
            return False
        if job is None:
            self.runner.unreserve(slot)
            return None
        self.limits.adopt_strays([job])
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
