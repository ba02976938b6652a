"""Claiming: look for due work only when there may be some, and lease it in batches.

Reasons to look (an insert or requeue seen on the stream, the due-job timer, a sweep, a
freed worker) are counted as signals; the claimer loop claims while there is room and the
last look may have left due work behind. A future `run_at` arms one timer, on the server's
clock, for the earliest due job.

Room (`room.py`): a dispatcher holds at most its workers plus its prefetch in jobs claimed
ahead or running (per queue with `BROOK_QUEUES`). It claims ahead, so a worker that reports
a result finds its next job already leased, but only about `AHEAD_S` of work (see
`Holdings.ahead`): a long task's round trips cost nothing worth hiding, and a job held
ahead behind long tasks would wait where another dispatcher could run it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from pymongo.errors import PyMongoError

from brook.common.domain.models import Job
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.metrics import CLAIMS
from brook.common.runtime.supervision import spawn_logged
from brook.dispatcher.claiming.due_timer import DueTimer
from brook.dispatcher.claiming.limits import Limits
from brook.dispatcher.claiming.policies import Admission, AdmitAll, KeyOnly, Take
from brook.dispatcher.claiming.room import Room, Target, TargetTurns
from brook.dispatcher.claiming.task_scope import scoped
from brook.dispatcher.wiring import Wiring

MAX_BATCH = 64
# Claims pause while this many finished tasks still wait for their outcome write (MongoDB
# is slower to take completions than the workers are to produce them).
MAX_FINISHING = 256



def merged(parts: list[list[bool | None]]) -> list[bool | None]:
    """The claims of a target's parts as one (all tasks; or the tasks that take a process,
    then the shared ones). A part that ran dry is left out while another part filled its
    room or lost races: the target is not dry (it is looked at again), and the batch size
    follows the parts that found jobs (a dry part of tasks taking a process must not keep a
    backlog of shared jobs claimed one at a time)."""
    if len(parts) > 1 and any(None not in got for got in parts):
        parts = [got for got in parts if None not in got]
    return [g for got in parts for g in got]


class Claimer:
    """Claims only jobs whose task this dispatcher runs, in the queues it serves: with
    `BROOK_QUEUES`, each queue up to its own workers; without, every queue within the
    concurrency. A queue with cluster-wide limits is its own target, claimed by the policy
    its limits choose (`Limits.policy`); the plain claims leave it out."""

    def __init__(
        self,
        wiring: Wiring,
        start: Take,
        limits: Limits,
        admission: Admission | None = None,
        refuse: Take | None = None,
    ) -> None:
        """`start` takes each claimed job (it waits for a worker in `holdings`); `refuse`
        hands back one the `admission` check does not let start (default: all start)."""
        self.settings = settings = wiring.settings
        self.store = wiring.store
        self.owner = wiring.owner
        self.holdings = wiring.holdings
        self.start = start
        self.tasks = wiring.tasks
        self.queues: Mapping[str, int] | None = settings.queues
        self.limits = limits
        limits.on_open = self._limits_opened
        limits.take = self._take
        self.admission: Admission = admission or AdmitAll()
        self.refuse: Take = refuse or start
        # Worker processes free now (the dispatcher sets it: the runner's count).
        self.free_workers: Callable[[], int] = lambda: self.settings.worker_slots
        self.room = Room(wiring, limits, lambda: self.free_workers())
        self.clock = clock = wiring.clock
        self.timer = DueTimer(self._next_due, clock, self._due_timer_fired)
        self._wake = asyncio.Event()
        self._stopping = False
        # `_signals` counts reasons to look for work; `_maybe_more` says the last look may
        # have left due work behind; `_dry` holds the targets found empty since the last
        # reason to look.
        self._signals = 0
        self._maybe_more = True
        self._dry: set[Target] = set()
        # Targets found dry only in the parts that had room (a part of their tasks had none:
        # its processes busy): a freed process makes them worth a look again.
        self._partly_dry: set[Target] = set()
        # What the reasons to look say: `_news` counts the jobs announced due one by one (an
        # insert, a requeue) that no look has claimed for yet; `_vague` says some reason named
        # no job (a sweep, the due timer, a queue opening): then looks go on until one finds
        # nothing. With only news, a look that claims every announced job is the last one:
        # no further claim that would find nothing (one round trip a job saved).
        self._news = 0
        self._vague = True
        self._batch = 1
        # News of a job that outranks all claimed ahead, or of a new key: its target, and
        # the key to claim from (None: the target's best job).
        self._urgent: dict[Target, KeyOnly] = {}
        self.turns = TargetTurns()
        self._claiming = False  # a look's claims are in flight
        self._jump: asyncio.Task[None] | None = None  # an urgent claim beside them

    def runs(self, task: object, queue: object) -> bool:
        """Whether a job of this task in this queue is one this dispatcher would claim."""
        served = self.queues is None or queue in self.queues
        return task in self.tasks and served

    @property
    def _targets(self) -> set[Target]:
        if self.queues:
            return set(self.queues)
        return {None, *self.limits.limited()}

    def target_of(self, queue: str) -> Target:
        """What a claim of a job of `queue` goes through: its queue (with `BROOK_QUEUES`, or
        limits), or None (the queues without limits, claimed together)."""
        return queue if self.queues or self.limits.is_limited(queue) else None

    def signal(self, queue: str | None = None, *, vague: bool = True) -> None:
        """There may be due work (in `queue`, when known): look for it. Not `vague`: one
        job was announced (`due_at`)."""
        self._signals += 1
        self._maybe_more = True
        if vague:
            self._vague = True
        if queue is None:
            self._dry.clear()
        else:
            self._dry.discard(self.target_of(queue))
        self._wake.set()

    def due_at(
        self,
        run_at: datetime | None,
        priority: int | None = None,
        queue: str | None = None,
        key: str | None = None,
    ) -> None:
        """A job became pending (in `queue`, when known): look now, or when it is due. A
        due job that outranks every job claimed ahead, or whose key or queue has nothing
        held here while other work fills the buffer, is claimed at once, alone, even while
        a batch claim is in flight (one such claim at a time, so the dispatcher holds at
        most one job over its workers plus prefetch), not when the buffer would next be
        refilled."""
        if queue is not None:
            self.limits.saw(queue, key)
        if run_at is not None and run_at.timestamp() > self.clock.now() + 0.002:
            self.timer.at(run_at.timestamp())
            return
        new_key = self._new_key(queue, key)
        new = new_key or self._new_target(queue)
        if new or (priority is not None and self.holdings.outranks(priority)):
            only = (key,) if new_key else None
            target = self.target_of(queue) if queue is not None else None
            self._urgent[target] = only
            if self._claiming and (self._jump is None or self._jump.done()):
                self._jump = spawn_logged(self._claim_urgent(target, only), "urgent-claim")
        self._news += 1
        self.signal(queue, vague=False)

    def _new_key(self, queue: str | None, key: str | None) -> bool:
        """A due job of a keyed queue whose key has nothing claimed or running here: its key's
        turn comes first (new keys go first), so it is claimed at once, alone, as a job that
        outranks the buffer is, not after the claim in flight."""
        return (
            queue is not None
            and self.limits.keyed(queue)
            and not self.holdings.holds_key(queue, key)
        )

    def _new_target(self, queue: str | None) -> bool:
        """A due job of a target (a queue claimed on its own, or the queues without limits
        together) with nothing claimed or running here, while other targets hold this
        dispatcher's shared workers: its turn comes first, as a new key's does, not after
        the claims ahead of it (with `BROOK_QUEUES` every queue has workers of its own)."""
        if self.queues is not None or queue is None or not self.limits.limited():
            return False
        target = self.target_of(queue)
        if target in self._urgent or self.holdings.active() == 0:
            return False  # told already; or nothing held, so the next look claims it
        return not self.holdings.holds_any(lambda j: self.target_of(j.queue) == target)

    async def _claim_urgent(self, target: Target, only: KeyOnly) -> None:
        """Claim one job of `target` beside the claim in flight: the best due job of the new
        key `only` (its job, not the next in turn), or of the target."""
        if self._stopping or (target is not None and not self._may_claim(target)):
            return
        # Only while claiming ahead at all, and at most one over: a batch in flight fills
        # at most the room there was when it was sent.
        parts = [tasks for tasks, room in self.room.parts(target, urgent=True) if room > 0]
        if parts:
            self._urgent.pop(target, None)
            with scoped(parts[0]):
                await self._claim_for(target, 1, only)

    def _due_timer_fired(self) -> None:
        self.limits.keys_stale()  # a job now due may be of a key its queue's turns dropped
        self.signal()

    def _limits_opened(self, queue: str | None) -> None:
        """A limited queue may start jobs again (None: the limits changed): its due jobs
        count for the timer again, and it is looked at."""
        self.timer.rearm = True
        self.signal(queue)

    def sweep_done(self) -> None:
        """The slow path looked too: claim what no event announced, re-arm the timer."""
        self.timer.rearm = True
        self.signal()

    def worker_freed(self) -> None:
        """A worker (or room in the buffer) may be free: look again if there may be work."""
        if self._partly_dry:
            # What is due there is unknown (only other parts were looked at): as a sweep.
            self._dry -= self._partly_dry
            self._partly_dry.clear()
            self._maybe_more = self._vague = True
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

    def _rooms(self) -> list[Target]:
        """Targets to look at: room (finishing jobs no longer count: their task is over,
        only the outcome write is left), news of work, and (a limited queue) a queue slot may
        be free. A limited queue's jobs claimed ahead hold its cluster-wide queue slots: a
        queue slot counts a leased job, claimed ahead or running."""
        if self.holdings.finishing_count() >= MAX_FINISHING:
            return []
        return [
            t
            for t in self.turns.order(self._targets)
            if t not in self._dry
            and (t is None or self._may_claim(t))
            and self.room.total(t, t in self._urgent) > 0
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
        urgent, self._urgent = self._urgent, {}
        # A job that outranks the work claimed ahead (or a new key's) is claimed first, alone:
        # one round trip. Then each target in turn fills the room the ones before it left.
        targets = [t for t in targets if t in urgent] + [t for t in targets if t not in urgent]
        self._claiming = True
        results: dict[Target, list[bool | None]] = {}
        try:
            for target in targets:
                got = await self._claim_parts(target, target in urgent, urgent.get(target))
                if got:
                    results[target] = got
        finally:
            self._claiming = False
        self.turns.took([t for t, got in results.items() if True in got])
        if not results:
            return False
        filled = all(all(got) for got in results.values())
        self._batch = min(self._batch * 2, MAX_BATCH) if filled else 1
        took = sum(got.count(True) for got in results.values())
        self._news = max(self._news - took, 0)
        if filled and not self._vague and self._news == 0 and self._signals == seen:
            self._maybe_more = False  # every job announced is claimed; nothing said more
            return False
        if self._signals == seen:  # news while we claimed: a dry target may not be dry
            self._dry.update(t for t, got in results.items() if None in got)
        if any(None not in got for got in results.values()):
            return True  # a target filled its room or lost races: there may be more
        closed = {t for t in self._targets if t is not None and not self._may_claim(t)}
        if self._signals == seen and self._dry | closed >= self._targets:
            self._maybe_more = False  # nothing due anywhere it may start, and no news meanwhile
            self._news, self._vague = 0, False
        if self.timer.rearm:
            await self.timer.arm_for_next_due()
        if not any(True in got for got in results.values()) and self._maybe_more:
            await asyncio.sleep(0)  # let the news that raced us land
        return True

    async def _claim_parts(self, target: Target, hurry: bool, only: KeyOnly) -> list[bool | None]:
        """Claim in `target` for each part of its room (`Room.parts`), within its room."""
        parts: list[list[bool | None]] = []
        skipped = False
        for tasks, room in self.room.parts(target, hurry):
            if room > 0:
                with scoped(tasks):
                    parts.append(await self._claim_for(target, 1 if hurry else room, only))
            else:
                skipped = True
        if skipped and parts:
            self._partly_dry.add(target)
        else:
            self._partly_dry.discard(target)
        return merged(parts)

    async def _claim_for(
        self, target: Target, room: int, only: KeyOnly = None
    ) -> list[bool | None]:
        """Claim up to `room` jobs of `target` by its policy: True per job claimed, None for
        room the target could not fill (it ran dry, or is closed), False for room lost to
        another dispatcher's race."""
        if target is not None and self.limits.is_limited(target):
            n = min(room, MAX_BATCH)  # one write takes the queue slots for all
        else:
            # Claims in flight together overlap their round trips. Start with one and double
            # while every claim finds a job (a backlog); one event then costs one claim. A
            # job that outranks all claimed ahead is claimed alone: one round trip.
            n = min(room, self._batch)
            if not self._vague and self._news > 0:
                n = min(n, self._news)  # only announced jobs are known to be due
        try:
            got = await self.limits.policy(target).claim(n, only)
        except PyMongoError as exc:
            await self._claim_failed(exc)
            return [False]
        unfilled: bool | None = None if got.dry or got.blocked else False
        return [True] * len(got.jobs) + [unfilled] * (n - len(got.jobs))

    def _take(self, job: Job, sent: float) -> None:
        """A job a policy won: it waits for a worker, if the admission check lets it start
        here; else it is handed back at once."""
        CLAIMS.inc()
        if self.admission.admits(job):
            self.start(job, sent)
        else:
            self.refuse(job, sent)

    async def _claim_failed(self, exc: PyMongoError) -> None:
        """No primary (or similar): wait a little, look again."""
        log_event(Event.MONGO_UNAVAILABLE, level="warning", op="claim", error=str(exc)[:200])
        await asyncio.sleep(0.5)
        self.signal()
