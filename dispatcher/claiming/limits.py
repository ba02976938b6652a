"""Cluster-wide queue limits, as one dispatcher applies them.

The dispatcher keeps a view of which queues have limits (concurrency, rate, pause), loaded
when it starts and kept current by a change stream on `brook_queues` (and re-read every
sweep, in case an event was missed). Queues without limits never appear in it and their
claims never touch `brook_queues`. With no limits anywhere, the plain claim is what it
always was; once some queue has limits, a claim across every queue names the queues
with pending jobs and no limits (`plain_queues`), so the jobs waiting in limited queues
are never even scanned.

A claim in a limited queue goes through its slots (`brook.common.store.queues`): the candidate
jobs, one write that takes a slot for each (as many as the queue allows), the claim itself
(only before the slots' `claim_by`), and, only when needed, one write that gives back the
slots of jobs another dispatcher won and records the real starts for a rate. Each job's
slot is given back after its final write has landed. A queue claimed fairly with nothing
to count (`fair` alone, `QueueLimits.slotless`) takes no slots: its turns pick the
candidates and the claim takes them directly.

A queue whose claim got no slot is *closed* here until something can change that, so a
waiting queue never busy-loops: a full queue until a slot is released anywhere (the
change stream), a job is requeued, or the next sweep; a queue out of starts until its
rate window moves (a timer on the server's clock); a paused one until it is resumed.
After a requeue or a sweep, the first claim that finds a queue full prunes it
(`QueueStore.prune`): that is how slots a dead dispatcher held come back, once the
watchdog has requeued its jobs at lease expiry.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pymongo.errors import PyMongoError

from brook.common.domain.models import Job
from brook.common.domain.queues import RATE_START_MARGIN_S, BlockReason, QueueDoc, QueueLimits
from brook.common.runtime.backoff import Backoff
from brook.common.runtime.group_commit import GroupCommit
from brook.common.runtime.log_events import Event, emit
from brook.common.store.jobs import JobStore
from brook.common.store.queues import CONFIG_FIELDS, Pruned, QueueStore, Taken
from brook.dispatcher.claiming.key_slots import Held, KeySlots, moved
from brook.dispatcher.claiming.key_slots import held_key as _key
from brook.dispatcher.claiming.keyed_claims import Clock, KeyedClaims, key_of
from brook.dispatcher.wiring import Wiring

# How long a claim may take after writing its slots: after `claim_by`, no claim can use
# them, and a prune may free them. The claim is the very next round trip; a late one
# fails, and is tried again.
CLAIM_WINDOW_S = 5.0
MAX_RATE_BACKOFF_S = 1.0


@dataclass(frozen=True, kw_only=True)
class LimitedClaim:
    """What one claim in a limited queue got: its jobs (and the slots it took, by `tag`, for
    the jobs it `asked` for), whether the queue had fewer due jobs than asked (`dry`), or
    no slot at all (`blocked`: the queue is closed until something changes)."""

    queue: str
    jobs: list[Job]
    tag: str | None = None
    asked: tuple[str, ...] = ()
    rated: bool = False  # the queue has a rate: its starts are recorded
    dry: bool = False
    blocked: bool = False


class Gates:
    """Which limited queues may be tried now. Every event that may free a slot bumps the
    queue's generation; a claim that started before such an event does not close it."""

    def __init__(self, clock: Clock, opened: Callable[[str], None]) -> None:
        self.clock = clock
        self.opened = opened
        self._closed: dict[str, BlockReason] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._gen: Counter[str] = Counter()
        self._misses: Counter[str] = Counter()

    def generation(self, queue: str) -> int:
        return self._gen[queue]

    def is_open(self, queue: str) -> bool:
        return queue not in self._closed

    def closed(self) -> frozenset[str]:
        return frozenset(self._closed)

    def close(self, queue: str, reason: BlockReason, at: float | None, gen: int) -> bool:
        """Close `queue` (for the rate, until the server time `at`); False if an event came
        while the claim was looking, in which case the caller should look again."""
        if gen != self._gen[queue]:
            return False
        self._closed[queue] = reason
        if reason == "rate" and at is not None:
            # A timer that fires early (the clock estimate is off) finds the window still
            # full and waits a little longer each time: never a tight loop.
            extra = min(0.002 * 2 ** self._misses[queue], MAX_RATE_BACKOFF_S)
            self._misses[queue] += 1
            delay = max(at - self.clock.now(), 0.0) + extra
            self._cancel_timer(queue)
            self._timers[queue] = asyncio.get_running_loop().call_later(delay, self.open, queue)
        return True

    def claimed(self, queue: str) -> None:
        self._misses.pop(queue, None)

    def open(self, queue: str) -> None:
        """Something may have freed a slot of `queue` (or changed its limits)."""
        self._gen[queue] += 1
        self._cancel_timer(queue)
        if self._closed.pop(queue, None) is not None:
            self.opened(queue)

    def open_waiting(self, reasons: Iterable[BlockReason] = ("full",)) -> None:
        for queue, reason in list(self._closed.items()):
            if reason in reasons:
                self.open(queue)

    def forget(self, queue: str) -> None:
        self._closed.pop(queue, None)
        self._cancel_timer(queue)

    def _cancel_timer(self, queue: str) -> None:
        timer = self._timers.pop(queue, None)
        if timer is not None:
            timer.cancel()


class PendingQueues:
    """The queues that hold pending jobs, for a claim across every queue while some have
    limits: it names the others (one index scan each) instead of skipping the limited
    queues' jobs one by one. Re-read after `stale()` (every sweep, a requeue); a new job's
    queue is added as its insert is seen."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._queues: set[str] = set()
        self._seen_since: set[str] = set()
        self._stale = True

    def saw(self, queue: str) -> None:
        self._queues.add(queue)
        self._seen_since.add(queue)

    def stale(self) -> None:
        self._stale = True

    async def read(self) -> set[str]:
        if self._stale:
            self._seen_since = set()
            fresh = await self.store.pending_queues()
            self._queues = fresh | self._seen_since
            self._stale = False
        return self._queues


class Limits:
    def __init__(self, wiring: Wiring, queues: QueueStore) -> None:
        self.settings = wiring.settings
        self.queues = queues
        self.store = wiring.store
        self.owner = wiring.owner
        self.spawn = wiring.spawn
        self.clock: Clock = wiring.clock
        self.held_jobs: Callable[[], list[Job]] = wiring.holdings.jobs
        self.view: dict[str, QueueLimits] = {}
        self._limited: frozenset[str] = frozenset()
        self.held: dict[tuple[str, int], Held] = {}  # by `_key`
        # Queues that may hold slots of attempts that are over (a job was requeued, or a
        # sweep came): the next claim that finds one full prunes it first.
        self._suspect: set[str] = set()
        self.pending = PendingQueues(self.store)
        self.gates = Gates(self.clock, lambda queue: self.on_open(queue))
        # The turns of each keyed queue's keys (fair claiming, per-key limits).
        self.keys = KeyedClaims(self.store, self.clock, self.gates)
        lease = self.settings.lease_seconds
        args = (self.owner, lease, self.clock, self.keys, self.gates, self.held, self.spawn)
        self.on_jobs = KeySlots(self.store, *args)  # per-key slots held on the jobs
        # Set by the claimer: a queue may be claimed again (None: any queue may).
        self.on_open: Callable[[str | None], None] = lambda _queue: None
        self.loaded = asyncio.Event()
        # Slots given back, one group commit per queue: the jobs that finish while a
        # release is in flight give theirs back together in the next write.
        self._releases: dict[str, GroupCommit[tuple[str, str], None]] = {}

    # -- the view ----------------------------------------------------------------------------

    def limited(self) -> frozenset[str]:
        """Queues claimed through their slots; the plain claim leaves them out."""
        return self._limited

    def is_limited(self, queue: str | None) -> bool:
        return queue is not None and queue in self._limited

    def may_claim(self, queue: str) -> bool:
        limits = self.view.get(queue)
        return limits is not None and not limits.paused and self.gates.is_open(queue)

    def saw(self, queue: str, key: str | None = None) -> None:
        """A job (of `key`) was inserted into `queue`."""
        self.pending.saw(queue)
        self.keys.saw(queue, key)

    def keys_stale(self) -> None:
        """Keyed queues may hold keys their turns do not know (a requeue, a due timer)."""
        self.keys.stale()

    async def plain_queues(self) -> frozenset[str] | None:
        """What a claim across every queue may take: None without limits anywhere (any
        queue, the claim as it always was), else the queues with pending jobs but no
        limits."""
        if not self._limited:
            return None
        return frozenset(await self.pending.read() - self._limited)

    def closed(self) -> frozenset[str]:
        """Limited queues that cannot start a job now (their due jobs arm no timer)."""
        return frozenset(q for q in self._limited if not self.may_claim(q))

    def _apply(self, docs: Mapping[str, QueueDoc | None], *, complete: bool) -> None:
        """Update the view from these documents (`complete`: they are all there is)."""
        new = dict(self.view) if not complete else {}
        for name, doc in docs.items():
            if doc is not None and doc.limits.limited:
                new[name] = doc.limits
            else:
                new.pop(name, None)
        changed = {q for q in set(new) | set(self.view) if new.get(q) != self.view.get(q)}
        if not changed:
            return
        to_doc, to_jobs = moved(self.view, new, changed)
        self.view = new
        self._limited = frozenset(new)
        for queue in sorted(changed):
            limits = new.get(queue)
            emit(
                Event.QUEUE_LIMITS_SEEN,
                queue=queue,
                concurrency=limits.concurrency if limits else None,
                rate=str(limits.rate) if limits and limits.rate else None,
                paused=limits.paused if limits else False,
            )
            self.keys.forget(queue)  # new limits: the turns start afresh
            self.gates.forget(queue)
            self.gates.open(queue)
        held = self.held_jobs()
        self._adopt(j for j in held if j.queue in to_doc)
        self.on_jobs.adopt((j for j in held if j.queue in to_jobs), new)
        self.on_open(None)

    async def refresh(self) -> None:
        self._apply(await self.queues.limits(), complete=True)
        self.loaded.set()

    async def _reload(self, queue: str) -> None:
        self._apply({queue: await self.queues.read(queue)}, complete=False)

    # -- claims ----------------------------------------------------------------------------

    async def claim(
        self, queue: str, n: int, tasks: frozenset[str], *, only: tuple[str | None] | None = None
    ) -> LimitedClaim:
        """Claim up to `n` due jobs of `queue` within its limits: their slots first. In a
        keyed queue, by turns across its keys; with `only`, jobs of that one key."""
        gen = self.gates.generation(queue)
        limits = self.view.get(queue)
        lease = self.settings.lease_seconds
        if limits is not None and limits.slots_on_jobs and limits.key_concurrency is not None:
            c = await self.on_jobs.claim(queue, limits.key_concurrency, n, tasks, gen, only)
            return LimitedClaim(queue=queue, jobs=c.jobs, dry=c.dry, blocked=c.blocked)
        if limits is not None and limits.slotless and only is not None and n == 1:
            got = await self.keys.claim_of_key(queue, only[0], tasks, self.owner, lease)
            return LimitedClaim(queue=queue, jobs=got)  # a new key's job: one write
        # More candidates than slots wanted: the best ones may be held by racing claims.
        want = 2 * n + 2
        keyed = limits is not None and limits.keyed
        if keyed:
            docs, dry = await self.keys.pick(queue, want, tasks, gen, only)
        else:
            docs = await self.store.candidates(want, tasks=tasks, queue=queue)
            dry = len(docs) < want
        if not docs:
            blocked = not self.gates.is_open(queue)
            return LimitedClaim(queue=queue, jobs=[], dry=dry, blocked=blocked)
        ids = [str(d["_id"]) for d in docs]
        keys = {str(d["_id"]): key_of(d) for d in docs} if keyed else None
        tag = secrets.token_hex(8)
        if limits is not None and limits.slotless:  # fair alone: nothing to count
            got = await self.keys.claim_slotless(queue, docs[:n], tag, self.owner, lease)
            return LimitedClaim(queue=queue, jobs=got, dry=dry and len(got) < n)
        taken = await self._take(queue, ids, tag, n, keys)
        if not taken.slots:
            taken = await self._refused(queue, gen, ids, tag, n, taken, keys)
        if not taken.slots or taken.queue is None:
            return LimitedClaim(queue=queue, jobs=[], blocked=not self.gates.is_open(queue))
        self.gates.claimed(queue)
        asked = tuple(s.job for s in taken.slots)
        if keys is not None:
            self.keys.served(queue, taken, gen)
        rated = taken.queue.limits.rated
        # Sent before the claim: its `claimed_at` (the time the rate records) is later.
        start_by = time.monotonic() + RATE_START_MARGIN_S if rated else None
        jobs = await self.store.claim_tagged(self.owner, lease, asked, tag, taken.claim_by)
        for job in jobs:
            self.held[_key(job)] = Held(queue=queue, tag=tag, start_by=start_by)
        return LimitedClaim(
            queue=queue,
            jobs=jobs,
            tag=tag,
            asked=asked,
            rated=rated,
            dry=dry and len(jobs) < n,
        )

    async def settle(self, claim: LimitedClaim) -> None:
        """After the claim: give back the slots of the jobs another dispatcher won, and with a
        rate, record when the won jobs were claimed (one write, only when needed). A rate
        counts claims, over a window `RATE_START_MARGIN_S` longer than its own; a claimed job
        starts within that margin or is handed back (`start_by`), so that its task's real
        start holds the rate too."""
        if claim.tag is None:
            return
        won = {j.id for j in claim.jobs}
        lost = [job_id for job_id in claim.asked if job_id not in won]
        # (A job whose claim time is not known keeps counting at its slot's `claim_by`.)
        claimed = {j.id: j.claimed_at for j in claim.jobs if j.claimed_at is not None}
        if not lost and not claim.rated:
            return
        try:
            await self.queues.settle(
                claim.queue,
                claim.tag,
                lost=lost,
                started=claimed if claim.rated else None,
                keys={j.id: j.key for j in claim.jobs},
            )
        except PyMongoError as exc:
            # Until a prune frees them after `claim_by`, the lost jobs' slots stay taken and
            # the won jobs count as starts at `claim_by`: late, never early.
            emit(Event.MONGO_UNAVAILABLE, level="warning", op="settle", error=str(exc)[:200])

    async def _take(
        self,
        queue: str,
        ids: list[str],
        tag: str,
        want: int,
        keys: Mapping[str, str | None] | None = None,
    ) -> Taken:
        # No longer than a lease: a dead claimer's slots are free by the time its jobs
        # are requeued.
        window = min(CLAIM_WINDOW_S, self.settings.lease_seconds)
        releases = self._releases.get(queue)

        async def take(release: Sequence[tuple[str, str]]) -> tuple[Taken, list[None]]:
            taken = await self.queues.take(
                queue,
                owner=self.owner,
                tag=tag,
                jobs=ids,
                claim_window_s=window,
                want=want,
                keys=keys,
                release=release,
            )
            return taken, [None] * len(release)

        if releases is None:
            return (await take(()))[0]
        # The slots of jobs that finished while the last release was in flight go back in
        # this write: one majority round trip for both, and the take counts them free.
        return await releases.carry(take)

    async def _refused(
        self,
        queue: str,
        gen: int,
        ids: list[str],
        tag: str,
        want: int,
        taken: Taken,
        keys: Mapping[str, str | None] | None = None,
    ) -> Taken:
        """No slot: why? A full queue that may hold what dead attempts left is pruned and
        tried once more; otherwise the queue is closed until what blocks it can change."""
        doc = taken.queue
        if doc is None or doc.limits != self.view.get(queue):
            self._apply({queue: doc}, complete=False)  # our view was behind
        if doc is None or not doc.limits.limited:
            return taken
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        reason, at = doc.blocked(now)
        if (reason == "full" or keys) and queue in self._suspect:
            self._suspect.discard(queue)
            pruned = await self.queues.prune(queue)
            self._reclaimed(queue, pruned)
            if pruned.slots:
                again = await self._take(queue, ids, tag, want, keys)
                if again.slots or again.queue is None:
                    return again
                doc = again.queue
                reason, at = doc.blocked(now)
        if reason == "room" and keys:
            keyed = self.keys.full(queue, doc, keys, gen, now)
            if keyed is None:
                return Taken(slots=[], queue=doc)  # other keys may start: claim again
            reason, at = keyed
        if reason == "room":
            again = await self._take(queue, ids, tag, want, keys)
            if again.slots or again.queue is None:
                return again
            reason, at = again.queue.blocked(now)
            if reason == "room":
                # Our clock runs ahead of the server's, or racing claims hold slots for all
                # our candidates: wait a little (longer each time), then look again.
                reason, at = "rate", now
        self.gates.close(queue, reason, at.timestamp() if at else None, gen)
        return Taken(slots=[], queue=doc)

    def _reclaimed(self, queue: str, pruned: Pruned) -> None:
        if not pruned.slots:
            return
        emit(
            Event.SLOTS_RECLAIMED,
            level="warning",
            queue=queue,
            freed=len(pruned.slots),
            jobs=sorted({s.job for s in pruned.slots}),
            owners=sorted({s.owner for s in pruned.slots if s.owner}),
            reason="attempts no longer running, or claims that never landed",
        )

    def adopt_strays(self, jobs: Iterable[Job]) -> None:
        """Jobs the plain claim took from a queue that has limits by now (this dispatcher
        had not heard of them yet when it claimed): give each a slot, so it counts."""
        strays = [j for j in jobs if j.queue in self._limited and _key(j) not in self.held]
        self._adopt(j for j in strays if not self.view[j.queue].slots_on_jobs)
        self.on_jobs.adopt((j for j in strays if self.view[j.queue].slots_on_jobs), self.view)

    def _adopt(self, jobs: Iterable[Job]) -> None:
        by_queue: dict[str, list[tuple[str, int, str, str | None]]] = {}
        for job in jobs:
            tag = secrets.token_hex(8)
            on_job = self.held[_key(job)].on_job if _key(job) in self.held else None
            self.held[_key(job)] = Held(queue=job.queue, tag=tag, on_job=on_job)  # kept
            by_queue.setdefault(job.queue, []).append((job.id, job.attempts, tag, job.key))
        for queue, entries in by_queue.items():
            self.spawn(self._adopt_write(queue, entries), f"adopt:{queue}")

    async def _adopt_write(
        self, queue: str, entries: list[tuple[str, int, str, str | None]]
    ) -> None:
        try:
            await self.queues.adopt(queue, entries)
        except PyMongoError as exc:
            emit(Event.MONGO_UNAVAILABLE, level="warning", op="adopt", error=str(exc)[:200])
            return
        emit(Event.SLOTS_ADOPTED, queue=queue, jobs=[e[0] for e in entries])

    def rated(self, queue: str | None) -> bool:
        """Whether `queue` has a rate (its claims wait for a free worker: no claim ahead)."""
        limits = self.view.get(queue) if queue is not None else None
        return limits is not None and limits.rated

    def keyed(self, queue: str | None) -> bool:
        """Whether `queue` is claimed by turns across keys (and its claimed jobs are handed to
        workers by how busy their keys are here)."""
        limits = self.view.get(queue) if queue is not None else None
        return limits is not None and limits.keyed

    def start_by(self, job: Job) -> float | None:
        """The latest `time.monotonic()` this held job's task may start (None: no limit)."""
        held = self.held.get(_key(job))
        return held.start_by if held is not None else None

    def finished(self, job: Job, *, over: bool) -> None:
        """The job's attempt ended here. `over`: its final write landed (or another attempt
        holds it), so its slot can go; otherwise it may still be running in MongoDB, and a
        prune frees the slot once the job shows it is not."""
        held = self.held.pop(_key(job), None)
        if held is not None:
            self.on_jobs.finished(held)
        if held is not None and held.tag is not None and over:
            self.spawn(self._release(held, job.id), f"release:{job.id}")

    async def _release(self, held: Held, job_id: str) -> None:
        releases = self._releases.get(held.queue)
        if releases is None:
            queue = held.queue

            async def write(slots: Sequence[tuple[str, str]]) -> list[None]:
                await self.queues.release_many(queue, slots)
                return [None] * len(slots)

            releases = self._releases[queue] = GroupCommit(write, spawn=self.spawn)
        assert held.tag is not None
        try:
            await releases.submit((job_id, held.tag))
        except PyMongoError as exc:
            emit(Event.MONGO_UNAVAILABLE, level="warning", op="release", error=str(exc)[:200])
            return
        self.gates.open(held.queue)

    def requeued(self) -> None:
        """A job went back to pending somewhere (a retry, a lease expiry): a full queue
        may have a slot to reclaim."""
        self._suspect.update(self._limited)
        self.pending.stale()
        self.keys_stale()
        self.gates.open_waiting()

    # -- loops -----------------------------------------------------------------------------

    async def follow(self) -> None:
        """Follow `brook_queues`: a change of limits updates the view, a released slot opens
        its queue. The view is re-read each time the stream (re)opens: nothing is missed."""
        backoff = Backoff(0.1, 5.0)
        while True:
            try:
                async with await self.queues.changes(max_await_ms=1000) as stream:
                    await self.refresh()
                    backoff.reset()
                    while stream.alive:
                        change = await stream.try_next()
                        if change is not None:
                            await self._on_change(change)
            except PyMongoError as exc:
                emit(Event.STREAM_ERROR, level="warning", stream="queues", error=str(exc)[:300])
                await asyncio.sleep(backoff.next())

    async def _on_change(self, change: Mapping[str, Any]) -> None:
        queue = str(change["documentKey"]["_id"])
        keys = set(change.get("keys") or ())
        update = change["operationType"] == "update"
        if not update or keys & set(CONFIG_FIELDS):
            await self._reload(queue)
        if not update or "released_at" in keys:
            self.gates.open(queue)

    async def tick(self) -> None:
        """Every sweep: re-read the limits (a missed event), and let full queues try again,
        so a slot a dead dispatcher left is found and freed by the next claim's prune."""
        while True:
            await asyncio.sleep(self.settings.sweep_seconds)
            try:
                await self.refresh()
            except PyMongoError as exc:
                emit(Event.MONGO_UNAVAILABLE, level="warning", op="limits", error=str(exc)[:200])
                continue
            self._suspect.update(self._limited)
            self.pending.stale()
            self.keys_stale()
            self.gates.open_waiting()
