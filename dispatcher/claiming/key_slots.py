"""Per-key slots held on the jobs themselves (`QueueLimits.slots_on_jobs`: a queue whose
only count is `key_concurrency`), as one dispatcher claims and holds them.

Each running job of a key holds one of the key's N slots in its own document: `key_slot`
is `"queue:index:key"`, set by the claim itself, and the unique partial index `key_slots`
(over running jobs) refuses a second job the same slot. The write that ends the attempt
(completion, failure, retry, cancel, the watchdog's requeue) frees it with the status. So a
claim is one write, there is nothing to give back, and a SIGKILLed dispatcher leaks nothing.

This dispatcher asks only for indexes its own jobs do not hold (`Slots`, its map of them).
An index held by another dispatcher's job stops the claim's write at that job (the jobs
claimed before it keep theirs); that key then waits `KEY_HELD_ELSEWHERE_S` out of turn,
since the release of a slot held on a job tells no other dispatcher.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pymongo.errors import PyMongoError

from brook.common.domain.models import Doc, Job
from brook.common.domain.queues import QueueLimits, key_slot
from brook.common.runtime.log_events import Event, log_event
from brook.common.store.jobs import Claimed, HoldingKeySlots, JobStore, OfKey
from brook.dispatcher.claiming.keyed_claims import KeyedClaims, key_of
from brook.dispatcher.claiming.policies import Got, KeyOnly
from brook.dispatcher.claiming.queue_gates import Clock, QueueGates

# How long a key whose slot another dispatcher's job holds waits before it is tried again
# (or until the next requeue or sweep).
KEY_HELD_ELSEWHERE_S = 0.1

At = tuple[str, int]  # a slot held on a job: its key and index


@dataclass(frozen=True, kw_only=True)
class SlotsHeld:
    """The slot a job of this dispatcher holds: in `brook_queues` (by `tag`), or on the job
    itself (`on_job`), or both while a queue's limits change under it; `latest_start`
    (`time.monotonic()`): for a queue with a rate, the latest its task may start, or it is
    handed back."""

    queue: str
    tag: str | None = None
    on_job: At | None = None
    latest_start: float | None = None


def slots_key(job: Job) -> tuple[str, int]:
    """What a held slot is kept by: an attempt's end never gives back a later one's slot."""
    return (job.id, job.attempts)




def moved(
    old: Mapping[str, QueueLimits], new: Mapping[str, QueueLimits], changed: Iterable[str]
) -> tuple[set[str], set[str]]:
    """Of the queues whose limits changed, those whose slots are now held in `brook_queues`
    where they were not (newly limited, or from the jobs), and those whose slots are now
    held on the jobs where they were not: their running jobs take a slot the new way."""
    to_doc: set[str] = set()
    to_jobs: set[str] = set()
    for q in changed:
        if q not in new:
            continue
        was = old.get(q)
        if new[q].slots_on_jobs and not (was is not None and was.slots_on_jobs):
            to_jobs.add(q)
        elif not new[q].slots_on_jobs and (was is None or was.slots_on_jobs):
            to_doc.add(q)
    return to_doc, to_jobs


class KeySlots:
    def __init__(
        self,
        store: JobStore,
        owner: str,
        lease_s: float,
        clock: Clock,
        keys: KeyedClaims,
        gates: QueueGates,
        held: dict[tuple[str, int], SlotsHeld],
        spawn: Callable[[Coroutine[Any, Any, None], str], object],
    ) -> None:
        self.store = store
        self.owner = owner
        self.lease_s = lease_s
        self.clock = clock
        self.keys = keys
        self.gates = gates
        self.held = held
        self.spawn = spawn
        # The indexes this dispatcher's jobs hold (or its claims in flight ask for), by
        # queue and key: a claim asks for others.
        self._used: dict[str, dict[str, set[int]]] = {}

    async def claim(
        self,
        queue: str,
        limit: int,
        n: int,
        tasks: frozenset[str],
        gen: int,
        only: KeyOnly,
    ) -> Got:
        """Up to `n` jobs by turns across the queue's keys, each of a key asking for an index
        this dispatcher does not hold (a key with none left waits for one of its jobs here
        to end), in one write that claims them and takes their slots."""
        # A new key's job, claimed out of turn: its best job is found by the claim itself.
        urgent = only[0] if only is not None and only[0] is not None and n == 1 else None
        if urgent is not None:
            docs: list[Doc] = [{"_id": "", "key": urgent}]
            dry = False
        else:
            # A few more candidates than it claims (a key may be full, or its job won by
            # another claim): none takes a slot in `brook_queues`, so few are lost.
            docs, dry = await self.keys.pick(queue, n + 2, tasks, gen, only)
        if not docs:
            return Got(jobs=[], dry=dry, blocked=not self.gates.is_open(queue))
        asked, full = self.ask(queue, limit, docs, n)
        if full:
            self.keys.wait(queue, dict.fromkeys(full), gen)
        if not asked:
            return Got(jobs=[], blocked=self.keys.wait_all_if_waiting(queue, gen))
        try:
            got = await self._write(queue, urgent, asked, tasks)
        finally:
            for at in asked.values():
                if at is not None:
                    self.free(queue, *at)
        self.gates.claimed(queue)
        for job in got.jobs:
            at = asked.get("" if urgent is not None else job.id)
            if at is not None:
                self._used.setdefault(queue, {}).setdefault(at[0], set()).add(at[1])
            self.held[slots_key(job)] = SlotsHeld(queue=queue, on_job=at)
        self.keys.served_keys(queue, [job.key for job in got.jobs])
        if got.refused is not None:
            _, _, key = got.refused.split(":", 2)
            self.keys.wait(queue, {key: self.clock.now() + KEY_HELD_ELSEWHERE_S}, gen)
            log_event(
                Event.KEY_HELD_ELSEWHERE, level="debug", queue=queue, key=key, slot=got.refused
            )
            dry = False  # the claim stopped at that key: the others may have more
        return Got(jobs=got.jobs, dry=dry and len(got.jobs) < n)

    async def _write(
        self, queue: str, urgent: str | None, asked: Mapping[str, At | None], tasks: frozenset[str]
    ) -> Claimed:
        if urgent is not None and (at := asked.get("")) is not None:
            slot = key_slot(queue, *at)
            ask = OfKey(queue=queue, key=urgent, tasks=tasks, key_slot=slot)
            return await self.store.claim(self.owner, self.lease_s, ask)
        slots = {i: key_slot(queue, *a) if a else None for i, a in asked.items()}
        with_slots = HoldingKeySlots(slots=slots, tag=secrets.token_hex(8))
        return await self.store.claim(self.owner, self.lease_s, with_slots)

    def ask(
        self, queue: str, limit: int, docs: Sequence[Doc], n: int
    ) -> tuple[dict[str, At | None], list[str]]:
        """Up to `n` of these candidates (by id), each with the slot it asks for (its key and
        a free index here; None: a job without a key counts against no key), reserved until
        the claim answers; and the keys that have no index left here."""
        held = self._used.setdefault(queue, {})
        asked: dict[str, At | None] = {}
        full: list[str] = []
        for doc in docs:
            if len(asked) >= n:
                break
            key = key_of(doc)
            if key is None:
                asked[str(doc["_id"])] = None
                continue
            used = held.setdefault(key, set())
            # (After the limit was lowered, higher indexes may still be held: they count.)
            index = next((i for i in range(limit) if i not in used), None)
            if index is None or len(used) >= limit:
                if key not in full:
                    full.append(key)
                continue
            used.add(index)
            asked[str(doc["_id"])] = (key, index)
        return asked, full

    def free(self, queue: str, key: str, index: int) -> None:
        keys = self._used.get(queue, {})
        used = keys.get(key)
        if used is None:
            return
        used.discard(index)
        if not used:
            del keys[key]

    def finished(self, held: SlotsHeld) -> None:
        """A job holding a slot on itself ended here: its final write gave the slot back with
        the status (or its attempt may still be running in MongoDB: a claim that asks for
        that slot is refused until the watchdog requeues it)."""
        if held.on_job is None:
            return
        self.free(held.queue, *held.on_job)
        if held.tag is None:
            self.gates.open(held.queue)

    def adopt(self, jobs: Iterable[Job], view: Mapping[str, QueueLimits]) -> None:
        """Jobs this dispatcher holds in a queue whose per-key slots are now held on the jobs:
        each of a key takes a slot there, while one is free (one that finds none runs on
        over the limit, as it started before it)."""
        for job in jobs:
            limits = view.get(job.queue)
            if job.key is None or limits is None or limits.key_concurrency is None:
                continue
            old = self.held.get(slots_key(job))
            if old is not None and old.on_job is not None:
                continue  # it holds one already (its queue's limits went and came back)
            candidate = {"_id": job.id, "key": job.key}
            asked, _ = self.ask(job.queue, limits.key_concurrency, [candidate], 1)
            at = asked.get(job.id)
            if at is None:
                continue
            tag = old.tag if old is not None else None
            self.held[slots_key(job)] = SlotsHeld(queue=job.queue, tag=tag, on_job=at)
            self.spawn(self._take(job, at), f"adopt-slot:{job.id}")

    async def _take(self, job: Job, at: At) -> None:
        slot = key_slot(job.queue, *at)
        try:
            took = await self.store.take_key_slot(self.owner, job.id, job.attempts, slot)
        except PyMongoError as exc:
            log_event(
                Event.MONGO_UNAVAILABLE, level="warning", op="take_slot", error=str(exc)[:200]
            )
            took = False
        if not took:
            held = self.held.get(slots_key(job))
            if held is not None and held.on_job == at:
                self.held[slots_key(job)] = SlotsHeld(queue=held.queue, tag=held.tag)
            self.free(job.queue, *at)
            return
        log_event(Event.SLOTS_ADOPTED, queue=job.queue, jobs=[job.id], slot=slot)
