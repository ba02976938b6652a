"""Claim policies: how one claim is made in one target (a queue, or every queue without
limits together), chosen once per target from its limits (`Limits.policy`) and chosen again
only when they change:

  `PlainClaim`      no limits: the best due jobs, one write (`BestDue`)
  `AgedClaim`       no limits, with priority aging: the old jobs that outrank the claim
                    order's first, then the plain claim (`aging.py`)
  `QueueSlotsClaim` a queue with a concurrency or a rate: its queue slots in `brook_queues`
                    first, then the jobs under them (`queue_slots.py`), by turns across its
                    keys when it is keyed
  `KeySlotsClaim`   a per-key limit alone: each job holds its key slot on itself
                    (`key_slots.py`), by turns across the keys
  `FairClaim`       `fair` alone: by turns across the keys, nothing to count
                    (`keyed_claims.py`)

Every policy hands each job it won to the claimer's `Take` as soon as it is won, with when
its claim was sent; the claimer asks the `Admission` check whether the job may start (quotas
on single jobs are to come: today every job is admitted)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from brook.common.domain.models import Doc, Job
from brook.common.store.jobs import BestDue
from brook.dispatcher.claiming.task_scope import tasks_now

if TYPE_CHECKING:
    from brook.dispatcher.claiming.aging import Aging
    from brook.dispatcher.claiming.key_slots import KeySlots
    from brook.dispatcher.claiming.keyed_claims import KeyedClaims
    from brook.dispatcher.claiming.queue_gates import QueueGates
    from brook.dispatcher.claiming.queue_slots import QueueSlots
    from brook.dispatcher.wiring import Wiring

# A claimed job, and when (`time.monotonic()`) its claim was sent: its lease runs from no
# earlier than that, by the server's clock.
Take = Callable[[Job, float], None]
# A claim of one key's jobs only (a new key's, claimed out of turn), or None: by turns.
KeyOnly = tuple[str | None] | None


@dataclass(frozen=True, kw_only=True)
class Got:
    """What one claim won (each job already handed to `Take`); whether the target had fewer
    due jobs than asked (`dry`), or no slot at all (`blocked`: the queue is closed until
    something changes)."""

    jobs: list[Job]
    dry: bool = False
    blocked: bool = False


class ClaimPolicy(Protocol):
    async def claim(self, n: int, only: KeyOnly = None) -> Got:
        """Claim up to `n` due jobs (with `only`, of that one key), handing each to `Take`."""
        ...


class Admission(Protocol):
    """A per-job check beside the target's policy, consulted for every job any policy
    claims: whether it may start here. A job it refuses is handed back at once."""

    def admits(self, job: Job) -> bool: ...


class AdmitAll:
    """The default admission: every claimed job may start."""

    def admits(self, job: Job) -> bool:
        return True


class Scope(Protocol):
    """What a claim across queues must know of the limited ones (`Limits`)."""

    def limited(self) -> frozenset[str]: ...

    async def plain_queues(self) -> frozenset[str] | None: ...

    def adopt_strays(self, jobs: Iterable[Job]) -> None: ...


class PlainClaim:
    """A target without limits: its best due jobs in one write (one job: a
    `findOneAndUpdate`, the quickest). Across every queue (target None) once some queues have
    limits, it leaves those out and names the others (`Limits.plain_queues`)."""

    def __init__(self, wiring: Wiring, target: str | None, scope: Scope, take: Take) -> None:
        self.store = wiring.store
        self.owner = wiring.owner
        self.tasks = wiring.tasks
        self.lease_s = wiring.settings.lease_seconds
        self.target = target
        self.scope = scope
        self.take = take

    async def claim(self, n: int, only: KeyOnly = None) -> Got:
        exclude, among = await self.bounds()
        return await self.claim_within(n, exclude, among)

    async def bounds(self) -> tuple[frozenset[str], frozenset[str] | None]:
        """The limited queues to leave out, and the queues it may take from (None: any)."""
        if self.target is not None:
            return frozenset(), None
        return self.scope.limited(), await self.scope.plain_queues()

    async def claim_within(
        self, n: int, exclude: frozenset[str], among: frozenset[str] | None
    ) -> Got:
        sent = time.monotonic()
        tasks = tasks_now(self.tasks)
        ask = BestDue(n=n, tasks=tasks, queue=self.target, exclude=exclude, among=among)
        got = await self.store.claim(self.owner, self.lease_s, ask)
        # Jobs of a queue that has limits by now (not heard of yet when it claimed).
        self.scope.adopt_strays(got.jobs)
        for job in got.jobs:
            self.take(job, sent)
        return Got(jobs=got.jobs, dry=got.dry)


class AgedClaim:
    """A target without limits, with priority aging: the old jobs whose effective priority
    beats the claim order's first (at most once per check interval) are claimed first, and
    go to a worker before the jobs claimed ahead by stored priority; then the plain claim
    fills the rest."""

    def __init__(self, plain: PlainClaim, aging: Aging, wiring: Wiring) -> None:
        self.plain = plain
        self.aging = aging
        self.holdings = wiring.holdings

    async def claim(self, n: int, only: KeyOnly = None) -> Got:
        exclude, among = await self.plain.bounds()
        sent = time.monotonic()
        queue = self.plain.target
        aged = await self.aging.claim(n, queue=queue, exclude=exclude, among=among)
        self.plain.scope.adopt_strays(aged)
        for job in aged:
            self.holdings.aged(job.id)  # before the jobs claimed ahead by stored priority
            self.plain.take(job, sent)
        if len(aged) == n:
            return Got(jobs=aged)
        got = await self.plain.claim_within(n - len(aged), exclude, among)
        return Got(jobs=aged + got.jobs, dry=got.dry)


class FairClaim:
    """A queue claimed fairly with nothing to count (`QueueLimits.slotless`): candidates by
    turns across its keys, claimed directly (no slots to take, settle or give back); a new
    key's job in one write."""

    def __init__(
        self, queue: str, keys: KeyedClaims, gates: QueueGates, wiring: Wiring, take: Take
    ) -> None:
        self.queue = queue
        self.keys = keys
        self.gates = gates
        self.owner = wiring.owner
        self.tasks = wiring.tasks
        self.lease_s = wiring.settings.lease_seconds
        self.take = take

    async def claim(self, n: int, only: KeyOnly = None) -> Got:
        sent = time.monotonic()
        queue, owner, lease_s = self.queue, self.owner, self.lease_s
        if only is not None and n == 1:
            tasks = tasks_now(self.tasks)
            jobs = await self.keys.claim_of_key(queue, only[0], tasks, owner, lease_s)
            dry = False
        else:
            gen = self.gates.generation(queue)
            # More candidates than it claims: the best ones may be won by racing claims.
            want = 2 * n + 2
            docs: list[Doc]
            docs, dry = await self.keys.pick(queue, want, tasks_now(self.tasks), gen, only)
            if not docs:
                return Got(jobs=[], dry=dry, blocked=not self.gates.is_open(queue))
            jobs = await self.keys.claim_slotless(queue, docs[:n], owner, lease_s)
            dry = dry and len(jobs) < n
        for job in jobs:
            self.take(job, sent)
        return Got(jobs=jobs, dry=dry)


class KeySlotsClaim:
    """A queue whose only count is a per-key limit (`QueueLimits.slots_on_jobs`): each job
    holds one of its key's slots on itself, taken by the claim's own write."""

    def __init__(
        self,
        queue: str,
        limit: int,
        slots: KeySlots,
        gates: QueueGates,
        wiring: Wiring,
        take: Take,
    ) -> None:
        self.queue = queue
        self.limit = limit
        self.slots = slots
        self.gates = gates
        self.tasks = wiring.tasks
        self.take = take

    async def claim(self, n: int, only: KeyOnly = None) -> Got:
        sent = time.monotonic()
        gen = self.gates.generation(self.queue)
        tasks = tasks_now(self.tasks)
        got = await self.slots.claim(self.queue, self.limit, n, tasks, gen, only)
        for job in got.jobs:
            self.take(job, sent)
        return got


class QueueSlotsClaim:
    """A queue with a concurrency or a rate: its queue slots in `brook_queues` first, then
    the jobs under them; the slots of jobs another dispatcher won are given back after."""

    def __init__(self, queue: str, slots: QueueSlots, take: Take) -> None:
        self.queue = queue
        self.slots = slots
        self.take = take

    async def claim(self, n: int, only: KeyOnly = None) -> Got:
        sent = time.monotonic()
        claim = await self.slots.claim(self.queue, n, only)
        for job in claim.jobs:
            self.take(job, sent)
        await self.slots.settle(claim)
        return Got(jobs=claim.jobs, dry=claim.dry, blocked=claim.blocked)
