"""Queue slots: a limited queue's concurrency and rate, counted in its `brook_queues`
document, as one dispatcher takes and gives them back.

A claim goes through the queue's slots (`brook.common.store.queues`): the candidate jobs,
one write that takes a queue slot for each (as many as the queue allows), the claim itself
(only before the slots' `claim_by`), and, only when needed, one write that gives back the
slots of jobs another dispatcher won and records the real starts for a rate. Each job's
slot is given back after its final write has landed, group-committed per queue.

A queue whose claim got no slot is closed (`QueueGates`) until what blocks it can change.
After a requeue or a sweep, the first claim that finds a queue full prunes it
(`QueueStore.prune`): that is how slots a dead dispatcher held come back, once the
watchdog has requeued its jobs at lease expiry.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pymongo.errors import PyMongoError

from brook.common.domain.models import Job
from brook.common.domain.queues import RATE_START_MARGIN_S, QueueDoc, QueueLimits
from brook.common.runtime.group_commit import GroupCommit
from brook.common.runtime.log_events import Event, log_event
from brook.common.store.jobs import Tagged
from brook.common.store.queues import Pruned, QueueStore, Taken
from brook.dispatcher.claiming.key_slots import SlotsHeld, slots_key
from brook.dispatcher.claiming.keyed_claims import KeyedClaims, key_of
from brook.dispatcher.claiming.policies import KeyOnly
from brook.dispatcher.claiming.queue_gates import QueueGates
from brook.dispatcher.claiming.task_scope import tasks_now
from brook.dispatcher.wiring import Wiring

# How long a claim may take after writing its slots: after `claim_by`, no claim can use
# them, and a prune may free them. The claim is the very next round trip; a late one
# fails, and is tried again.
CLAIM_WINDOW_S = 5.0


@dataclass(frozen=True, kw_only=True)
class SlotsClaim:
    """What one claim through a queue's slots got: its jobs (and the slots it took, by `tag`,
    for the jobs it `asked` for), whether the queue had fewer due jobs than asked (`dry`),
    or no slot at all (`blocked`: the queue is closed until something changes)."""

    queue: str
    jobs: list[Job]
    tag: str | None = None
    asked: tuple[str, ...] = ()
    rated: bool = False  # the queue has a rate: its starts are recorded
    dry: bool = False
    blocked: bool = False


class QueueSlots:
    def __init__(
        self,
        wiring: Wiring,
        queues: QueueStore,
        gates: QueueGates,
        keys: KeyedClaims,
        held: dict[tuple[str, int], SlotsHeld],
        view: Callable[[], Mapping[str, QueueLimits]],
        behind: Callable[[str, QueueDoc | None], None],
    ) -> None:
        """`held`: the slots this dispatcher's jobs hold, shared with `Limits`; `view`: the
        queues' limits as this dispatcher knows them; `behind`: a queue's document showed
        limits the view did not have."""
        self.settings = wiring.settings
        self.store = wiring.store
        self.owner = wiring.owner
        self.tasks = wiring.tasks
        self.spawn = wiring.spawn
        self.clock = wiring.clock
        self.queues = queues
        self.gates = gates
        self.keys = keys
        self.held = held
        self.view = view
        self.behind = behind
        # Queues that may hold slots of attempts that are over (a job was requeued, or a
        # sweep came): the next claim that finds one full prunes it first.
        self.suspect: set[str] = set()
        # Slots given back, one group commit per queue: the jobs that finish while a
        # release is in flight give theirs back together in the next write.
        self._releases: dict[str, GroupCommit[tuple[str, str], None]] = {}

    async def claim(self, queue: str, n: int, only: KeyOnly = None) -> SlotsClaim:
        """Claim up to `n` due jobs of `queue` within its limits: their slots first. In a
        keyed queue, by turns across its keys; with `only`, jobs of that one key."""
        gen = self.gates.generation(queue)
        limits = self.view().get(queue)
        lease, tasks = self.settings.lease_seconds, tasks_now(self.tasks)
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
            return SlotsClaim(queue=queue, jobs=[], dry=dry, blocked=blocked)
        ids = [str(d["_id"]) for d in docs]
        keys = {str(d["_id"]): key_of(d) for d in docs} if keyed else None
        tag = secrets.token_hex(8)
        taken = await self._take(queue, ids, tag, n, keys)
        if not taken.slots:
            taken = await self._refused(queue, gen, ids, tag, n, taken, keys)
        if not taken.slots or taken.queue is None:
            return SlotsClaim(queue=queue, jobs=[], blocked=not self.gates.is_open(queue))
        self.gates.claimed(queue)
        asked = tuple(s.job for s in taken.slots)
        if keys is not None:
            self.keys.served(queue, taken, gen)
        rated = taken.queue.limits.rated
        # Sent before the claim: its `claimed_at` (the time the rate records) is later.
        latest_start = time.monotonic() + RATE_START_MARGIN_S if rated else None
        ask = Tagged(ids=asked, tag=tag, before=taken.claim_by)
        jobs = (await self.store.claim(self.owner, lease, ask)).jobs
        for job in jobs:
            self.held[slots_key(job)] = SlotsHeld(
                queue=queue, tag=tag, latest_start=latest_start
            )
        return SlotsClaim(
            queue=queue,
            jobs=jobs,
            tag=tag,
            asked=asked,
            rated=rated,
            dry=dry and len(jobs) < n,
        )

    async def settle(self, claim: SlotsClaim) -> None:
        """After the claim: give back the slots of the jobs another dispatcher won, and with a
        rate, record when the won jobs were claimed (one write, only when needed). A rate
        counts claims, over a window `RATE_START_MARGIN_S` longer than its own; a claimed job
        starts within that margin or is handed back (`latest_start`), so that its task's real
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
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op="settle", error=str(exc)[:200])

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
        if doc is None or doc.limits != self.view().get(queue):
            self.behind(queue, doc)  # our view was behind
        if doc is None or not doc.limits.limited:
            return taken
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        reason, at = doc.blocked(now)
        if (reason == "full" or keys) and queue in self.suspect:
            self.suspect.discard(queue)
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
        log_event(
            Event.SLOTS_RECLAIMED,
            level="warning",
            queue=queue,
            freed=len(pruned.slots),
            jobs=sorted({s.job for s in pruned.slots}),
            owners=sorted({s.owner for s in pruned.slots if s.owner}),
            reason="attempts no longer running, or claims that never landed",
        )

    def adopt(self, jobs: Iterable[Job]) -> None:
        """Jobs this dispatcher holds in a queue whose slots are now counted in its document:
        each takes a queue slot there (one write per queue), keeping any key slot it holds."""
        by_queue: dict[str, list[tuple[str, int, str, str | None]]] = {}
        for job in jobs:
            tag = secrets.token_hex(8)
            on_job = self.held[slots_key(job)].on_job if slots_key(job) in self.held else None
            self.held[slots_key(job)] = SlotsHeld(queue=job.queue, tag=tag, on_job=on_job)  # kept
            by_queue.setdefault(job.queue, []).append((job.id, job.attempts, tag, job.key))
        for queue, entries in by_queue.items():
            self.spawn(self._adopt_write(queue, entries), f"adopt:{queue}")

    async def _adopt_write(
        self, queue: str, entries: list[tuple[str, int, str, str | None]]
    ) -> None:
        try:
            await self.queues.adopt(queue, entries)
        except PyMongoError as exc:
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op="adopt", error=str(exc)[:200])
            return
        log_event(Event.SLOTS_ADOPTED, queue=queue, jobs=[e[0] for e in entries])

    async def release(self, held: SlotsHeld, job_id: str) -> None:
        """Give back the queue slot of a job whose final write landed (group-committed)."""
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
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op="release", error=str(exc)[:200])
            return
        self.gates.open(held.queue)

