"""Cluster-wide queue limits, as one dispatcher applies them, and the claim policy each
target takes from them (`policy`, `policies.py`).

The dispatcher keeps a view of which queues have limits (concurrency, rate, pause, per-key
limits, fair), loaded when it starts and kept current by a change stream on `brook_queues`
(and re-read every sweep, in case an event was missed). Queues without limits never appear
in it and their claims never touch `brook_queues`. With no limits anywhere, the plain
claim is what it always was; once some queue has limits, a claim across every queue names
the queues with pending jobs and no limits (`plain_queues`), so the jobs waiting in
limited queues are never even scanned.

A limited queue is claimed through its queue slots (`queue_slots.py`), its key slots
(`key_slots.py`) or, `fair` alone, by turns with nothing to count (`keyed_claims.py`); a
queue whose claim got no slot is closed here (`queue_gates.py`) until something can change
that. Each job's slots are given back after its final write has landed (`finished`).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pymongo.errors import PyMongoError

from brook.common.domain.models import Job
from brook.common.domain.queues import QueueDoc, QueueLimits
from brook.common.runtime.backoff import Backoff
from brook.common.runtime.log_events import Event, log_event
from brook.common.store.jobs import JobStore
from brook.common.store.queues import CONFIG_FIELDS, QueueStore
from brook.dispatcher.claiming.aging import Aging
from brook.dispatcher.claiming.key_slots import KeySlots, SlotsHeld, moved, slots_key
from brook.dispatcher.claiming.keyed_claims import KeyedClaims
from brook.dispatcher.claiming.policies import (
    AgedClaim,
    ClaimPolicy,
    FairClaim,
    KeySlotsClaim,
    PlainClaim,
    QueueSlotsClaim,
    Take,
)
from brook.dispatcher.claiming.queue_gates import Clock, QueueGates
from brook.dispatcher.claiming.queue_slots import QueueSlots
from brook.dispatcher.wiring import Wiring


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
        self.wiring = wiring
        self.settings = wiring.settings
        self.queues = queues
        self.store = wiring.store
        self.clock: Clock = wiring.clock
        self.held_jobs: Callable[[], list[Job]] = wiring.holdings.jobs
        self.view: dict[str, QueueLimits] = {}
        self._limited: frozenset[str] = frozenset()
        # The queue and key slots this dispatcher's jobs hold, by `slots_key`.
        self.held: dict[tuple[str, int], SlotsHeld] = {}
        self.pending = PendingQueues(self.store)
        self.gates = QueueGates(self.clock, lambda queue: self.on_open(queue))
        # The turns of each keyed queue's keys (fair claiming, per-key limits).
        self.keys = KeyedClaims(self.store, self.clock, self.gates)
        lease = self.settings.lease_seconds
        args = (wiring.owner, lease, self.clock, self.keys, self.gates, self.held, wiring.spawn)
        self.key_slots = KeySlots(self.store, *args)  # per-key slots held on the jobs
        self.queue_slots = QueueSlots(
            wiring,
            queues,
            self.gates,
            self.keys,
            self.held,
            lambda: self.view,
            lambda queue, doc: self._apply({queue: doc}, complete=False),
        )
        aging = self.settings.priority_aging_seconds
        self.aging = Aging(wiring, aging) if aging is not None else None
        # Set by the claimer: a queue may be claimed again (None: any queue may); each
        # claimed job, as it is won.
        self.on_open: Callable[[str | None], None] = lambda _queue: None
        self.take: Take = lambda _job, _sent: None
        self.loaded = asyncio.Event()
        self._policies: dict[str | None, ClaimPolicy] = {}

    # -- the view ----------------------------------------------------------------------------

    def policy(self, target: str | None) -> ClaimPolicy:
        """How a claim in `target` (a queue, or None: every queue without limits) is made:
        chosen from its limits when first asked, and again after they change."""
        policy = self._policies.get(target)
        if policy is None:
            policy = self._policies[target] = self._choose(target)
        return policy

    def _choose(self, target: str | None) -> ClaimPolicy:
        wiring, take = self.wiring, self._take
        limits = self.view.get(target) if target is not None else None
        if target is None or limits is None:
            plain = PlainClaim(wiring, target, self, take)
            return plain if self.aging is None else AgedClaim(plain, self.aging, wiring)
        if limits.slots_on_jobs and limits.key_concurrency is not None:
            limit = limits.key_concurrency
            return KeySlotsClaim(target, limit, self.key_slots, self.gates, wiring, take)
        if limits.slotless:
            return FairClaim(target, self.keys, self.gates, wiring, take)
        return QueueSlotsClaim(target, self.queue_slots, take)

    def _take(self, job: Job, sent: float) -> None:
        self.take(job, sent)

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
            self._policies.pop(queue, None)
            limits = new.get(queue)
            log_event(
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
        self.queue_slots.adopt(j for j in held if j.queue in to_doc)
        self.key_slots.adopt((j for j in held if j.queue in to_jobs), new)
        self.on_open(None)

    async def refresh(self) -> None:
        self._apply(await self.queues.limits(), complete=True)
        self.loaded.set()

    async def _reload(self, queue: str) -> None:
        self._apply({queue: await self.queues.read(queue)}, complete=False)

    def adopt_strays(self, jobs: Iterable[Job]) -> None:
        """Jobs the plain claim took from a queue that has limits by now (this dispatcher
        had not heard of them yet when it claimed): give each a slot, so it counts."""
        strays = [j for j in jobs if j.queue in self._limited and slots_key(j) not in self.held]
        self.queue_slots.adopt(j for j in strays if not self.view[j.queue].slots_on_jobs)
        slots_on_jobs = (j for j in strays if self.view[j.queue].slots_on_jobs)
        self.key_slots.adopt(slots_on_jobs, self.view)

    def rated(self, queue: str | None) -> bool:
        """Whether `queue` has a rate (its claims wait for a free worker: no claim ahead)."""
        limits = self.view.get(queue) if queue is not None else None
        return limits is not None and limits.rated

    def keyed(self, queue: str | None) -> bool:
        """Whether `queue` is claimed by turns across keys (and its claimed jobs are handed to
        workers by how busy their keys are here)."""
        limits = self.view.get(queue) if queue is not None else None
        return limits is not None and limits.keyed

    def latest_start(self, job: Job) -> float | None:
        """The latest `time.monotonic()` this held job's task may start (None: no limit)."""
        held = self.held.get(slots_key(job))
        return held.latest_start if held is not None else None

    def finished(self, job: Job, *, over: bool) -> None:
        """The job's attempt ended here. `over`: its final write landed (or another attempt
        holds it), so its slot can go; otherwise it may still be running in MongoDB, and a
        prune frees the slot once the job shows it is not."""
        held = self.held.pop(slots_key(job), None)
        if held is not None:
            self.key_slots.finished(held)
        if held is not None and held.tag is not None and over:
            self.wiring.spawn(self.queue_slots.release(held, job.id), f"release:{job.id}")

    def requeued(self) -> None:
        """A job went back to pending somewhere (a retry, a lease expiry): a full queue
        may have a slot to reclaim."""
        self.queue_slots.suspect.update(self._limited)
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
                log_event(
                    Event.STREAM_ERROR, level="warning", stream="queues", error=str(exc)[:300]
                )
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
                log_event(
                    Event.MONGO_UNAVAILABLE, level="warning", op="limits", error=str(exc)[:200]
                )
                continue
            self.queue_slots.suspect.update(self._limited)
            self.pending.stale()
            self.keys_stale()
            self.gates.open_waiting()
