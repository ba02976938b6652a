"""Claims in a keyed queue (per-key concurrency or rate, or fair claiming), as one dispatcher
makes them: the turns of each queue's keys (`dispatcher.claiming.key_turns`) pick the candidates,
and what a take shows of the keys (full, out of starts) makes them wait their turn."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from brook.common.domain.models import Doc, Job
from brook.common.domain.queues import BlockReason, QueueDoc
from brook.common.store.jobs import JobStore, OfKey, Tagged
from brook.common.store.queues import Taken
from brook.dispatcher.claiming.key_turns import KeyTurns, interleave
from brook.dispatcher.claiming.queue_gates import Clock, QueueGates

# A claim without slots has no `claim_by` to meet.
NO_CLAIM_DEADLINE = datetime(9999, 1, 1, tzinfo=UTC)



class KeyedClaims:
    def __init__(self, store: JobStore, clock: Clock, gates: QueueGates) -> None:
        self.store = store
        self.clock = clock
        self.gates = gates
        self.turns: dict[str, KeyTurns] = {}

    def saw(self, queue: str, key: str | None) -> None:
        """A job of `key` was inserted into `queue`."""
        turns = self.turns.get(queue)
        if turns is not None:
            turns.saw(key)

    def stale(self) -> None:
        """Keyed queues may hold keys their turns do not know (a requeue, a due timer)."""
        for turns in self.turns.values():
            turns.stale = True

    def forget(self, queue: str) -> None:
        """The queue's limits changed: its turns start afresh."""
        self.turns.pop(queue, None)

    async def pick(
        self, queue: str, want: int, tasks: frozenset[str], gen: int, only: tuple[str | None] | None
    ) -> tuple[list[Doc], bool]:
        """A claim's candidates in a keyed queue (`{_id, key, priority}`, in the order to take
        them): by turns across its keys, or with `only`, of that one key's jobs; and whether
        the queue may have run dry. None due, but keys that wait: the queue waits with them."""
        if only is not None:
            return await self.of_key(queue, only[0], want, tasks), False  # says nothing of others
        docs, dry = await self.candidates(queue, want, tasks, gen)
        if not docs and not dry:
            self.all_wait(queue, gen)
        return docs, dry

    async def candidates(
        self, queue: str, want: int, tasks: frozenset[str], gen: int
    ) -> tuple[list[Doc], bool]:
        """A keyed queue's candidates, by turns across its keys
        (`dispatcher.claiming.key_turns`), and whether the queue may have run dry."""
        turns = self.turns.setdefault(queue, KeyTurns())
        turns.look_started()
        refreshed = False
        while True:
            if turns.stale:
                turns.refresh_started()
                turns.refreshed(await self.store.pending_keys(queue))
                refreshed = True
            now = self.clock.now()
            # Up to a key per job wanted (more than the claim takes: a key may be full, or
            # its job won by a racing claim). Many keys: each one's first due job. Few: each
            # key's share of the candidates wanted.
            picked = turns.pick(want, now, gen)
            if not picked:
                return [], not turns.waiting(now, gen)
            if len(picked) > want // 2:
                per_key = 1
                found = await self._firsts(queue, picked, tasks, now)
            else:
                per_key = -(-want // len(picked))
                found = await self.store.key_candidates(queue, picked, per_key, tasks=tasks)
            turns.dry(k for k, docs in found.items() if not docs)
            docs = interleave(found)
            if docs or refreshed:
                break
            turns.stale = True  # nothing due in the keys it knew: look for keys it missed
        # Dry: every key that may start a job was looked at (none is left that was not),
        # and none had more. (Keys found empty have left the turns by now.)
        others = turns.any_other(found, self.clock.now(), gen)
        dry = not others and all(len(v) < per_key for v in found.values())
        return docs, dry

    async def _firsts(
        self, queue: str, picked: list[str | None], tasks: frozenset[str], now: float
    ) -> dict[str | None, list[Doc]]:
        """The first due job of each picked key, in the turns' order: one distinct scan for
        the named keys (a seek each); a key whose first job is not due yet by this clock, and
        the jobs without a key, looked at one by one on the server's clock."""
        named = [k for k in picked if k is not None]
        firsts = await self.store.first_of_keys(queue, named, tasks=tasks)
        late = [
            k
            for k in picked
            if k is None or (k in firsts and firsts[k]["run_at"].timestamp() > now)
        ]
        more = await self.store.key_candidates(queue, late, 1, tasks=tasks) if late else {}
        return {k: more.get(k, [firsts[k]] if k in firsts else []) for k in picked}

    async def of_key(
        self, queue: str, key: str | None, want: int, tasks: frozenset[str]
    ) -> list[Doc]:
        """The best due jobs of one key (a new key's job, claimed out of turn at once)."""
        found = await self.store.key_candidates(queue, [key], want, tasks=tasks)
        return list(found.get(key, []))

    def wait(self, queue: str, waits: Mapping[str, float | None], gen: int) -> None:
        """These keys of `queue` wait out of turn: until the server time given, or (None)
        until a slot of the queue is released here."""
        self.turns.setdefault(queue, KeyTurns()).wait(waits, gen)

    def wait_all_if_waiting(self, queue: str, gen: int) -> bool:
        """If every key of `queue` waits, the queue waits with them (True); else another
        key may start a job now."""
        turns = self.turns.get(queue)
        if turns is None or not turns.waiting(self.clock.now(), gen):
            return False
        self.all_wait(queue, gen)
        return True

    def served_keys(self, queue: str, keys: Sequence[str | None]) -> None:
        """These keys got jobs: to the back of the turns."""
        if (turns := self.turns.get(queue)) is not None:
            turns.served(keys)

    def all_wait(self, queue: str, gen: int) -> None:
        """Every key of a keyed queue waits: the queue waits for a release, or for the first
        key rate window to move (an event meanwhile and it is looked at again)."""
        free = self.turns[queue].next_free()
        if free is not None:
            self.gates.close(queue, "rate", free, gen)
        else:
            self.gates.close(queue, "full", None, gen)

    def served(self, queue: str, taken: Taken, gen: int) -> None:
        """After a take in a keyed queue: the keys served go to the back of the turns, and
        the keys the queue shows full wait for a release (or their rate window)."""
        turns = self.turns.get(queue)
        doc = taken.queue
        if turns is None or doc is None:
            return
        turns.served([s.key for s in taken.slots])
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        keys = {s.key for s in doc.slots if s.key is not None}
        turns.wait(timestamps(doc.key_waits(keys, now)), gen)

    async def claim_slotless(
        self, queue: str, docs: list[Doc], owner: str, lease_s: float
    ) -> list[Job]:
        """A queue claimed fairly with nothing to count (`QueueLimits.slotless`): these
        candidates, in the turns' order, claimed directly (no slots to take, settle or give
        back: one write fewer per claim, none per finished job); the keys served go to the
        back of the turns."""
        ids = [str(d["_id"]) for d in docs]
        ask = Tagged(ids=ids, tag=secrets.token_hex(8), before=NO_CLAIM_DEADLINE)
        jobs = (await self.store.claim(owner, lease_s, ask)).jobs
        self.gates.claimed(queue)
        turns = self.turns.get(queue)
        if turns is not None:
            turns.served([key_of(d) for d in docs])
        return jobs

    async def claim_of_key(
        self, queue: str, key: str | None, tasks: frozenset[str], owner: str, lease_s: float
    ) -> list[Job]:
        """A slotless queue's new key: its best due job claimed directly (one write, its key
        to the back of the turns)."""
        job = (await self.store.claim(owner, lease_s, OfKey(queue=queue, key=key, tasks=tasks))).job
        self.gates.claimed(queue)
        if job is None:
            return []
        if (turns := self.turns.get(queue)) is not None:
            turns.served([key])
        return [job]

    def full(
        self,
        queue: str,
        doc: QueueDoc,
        keys: Mapping[str, str | None],
        gen: int,
        now: datetime,
    ) -> tuple[BlockReason, datetime | None] | None:
        """The queue had room but the candidates' keys had none: they wait out of turn. None
        if some other key may start a job now (claim again, without them); else why the
        whole queue waits, and for the rate, until when."""
        waits = doc.key_waits(keys.values(), now)
        if not waits:
            return "room", now  # not the keys: racing claims, or a clock ahead
        turns = self.turns.setdefault(queue, KeyTurns())
        turns.wait(timestamps(waits), gen)
        if not turns.waiting(now.timestamp(), gen):
            return None
        free = turns.next_free()
        if free is not None:
            return "rate", datetime.fromtimestamp(free, UTC)
        return "full", None


def key_of(doc: Mapping[str, Any]) -> str | None:
    key = doc.get("key")
    return str(key) if key is not None else None


def timestamps(waits: Mapping[str, datetime | None]) -> dict[str, float | None]:
    return {k: (at.timestamp() if at is not None else None) for k, at in waits.items()}
