"""Claiming jobs of the jobs collection: the best due pending job, or a batch, leased to a
dispatcher with a new attempt number (the fencing token); a limited queue's candidates and
their claim under the slots it took (`brook.common.store.queues`); the next due time."""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError
from pymongo.read_concern import ReadConcern

from brook.common.domain.models import Doc, Job
from brook.common.store import queries
from brook.common.store.fields import P, R, as_claimed
from brook.common.store.jobs.base import JOBS, JobsCollection
from brook.common.store.queries import CLAIM_SORT, claim_filter, claim_index

# The queues with pending jobs, as a distinct scan of `claim_by_queue` (hint it).
PENDING_QUEUES: tuple[dict[str, Any], ...] = (
    {"$match": {"status": P}},
    {"$sort": {"status": 1, "queue": 1}},
    {"$group": {"_id": "$queue"}},
)


def firsts_of_keys(
    queue: str, keys: Sequence[str], tasks: Collection[str] | None
) -> list[dict[str, Any]]:
    """The best pending job of each of `keys` in `queue` (of these tasks), by a distinct scan
    of `claim_by_key` (hint it): a `$group` with `$first` only, after a `$sort` in the
    index's order, on a `$match` the index bounds answer whole (a filter the index cannot
    answer, as `$expr`, or a null key, would make it read every job of the keys). Only
    fields the index holds: no job is read, only its index key."""
    match: dict[str, Any] = {"status": P, "queue": queue, "key": {"$in": list(keys)}}
    if tasks is not None:
        match["task"] = {"$in": sorted(tasks)}
    first = {f: {"$first": f"${f}"} for f in ("priority", "run_at")}
    return [
        {"$match": match},
        {"$sort": {"status": 1, "queue": 1, "key": 1, **dict(CLAIM_SORT)}},
        {"$group": {"_id": "$key", "id": {"$first": "$_id"}, **first}},
    ]


@dataclass(frozen=True)
class SlotClaim:
    """What a claim holding per-key slots on the jobs won, and the slot it found held by
    another running job (`refused`: the claim stopped there), if any."""

    jobs: list[Job] = field(default_factory=list)
    refused: str | None = None


def _held_slot(exc: DuplicateKeyError) -> str:
    """The `key_slot` a claim found taken; any other duplicate is not a claim's to explain."""
    slot = ((exc.details or {}).get("keyValue") or {}).get("key_slot")
    if not isinstance(slot, str):
        raise exc
    return slot


def in_claim_order(docs: list[Doc]) -> list[Doc]:
    """Jobs in the order a claim takes them: best priority, then earliest due."""
    return sorted(docs, key=lambda d: (-d["priority"], d["run_at"], d["_id"]))


class JobClaims(JobsCollection):
    """Claims: pending → running, and where to look for due work."""

    async def claim(
        self,
        owner: str,
        lease_seconds: float,
        *,
        tasks: Collection[str] | None = None,
        queue: str | None = None,
        exclude: Collection[str] = (),
        among: Collection[str] | None = None,
    ) -> Job | None:
        """Lease the best due pending job (of these tasks, in this queue) to `owner`;
        `attempts` + 1 is the new fencing token."""
        write = queries.claimed(
            owner, lease_seconds, tasks=tasks, queue=queue, exclude=exclude, among=among
        )
        return await self._claim_best(write, claim_index(tasks, queue, among))

    async def claim_of_key(
        self,
        owner: str,
        lease_seconds: float,
        queue: str,
        key: str | None,
        *,
        tasks: Collection[str] | None = None,
    ) -> Job | None:
        """Lease the best due pending job of one key of `queue` (a queue claimed by turns,
        with nothing to count) to `owner`: one `findOneAndUpdate` on `claim_by_key`."""
        write = queries.claimed_of_key(owner, lease_seconds, queue, key, tasks)
        return await self._claim_best(write, "claim_by_key")

    async def _claim_best(self, write: queries.Write, index: str) -> Job | None:
        """The first job of `write`'s filter in claim order (on `index`), claimed by it."""
        doc = await self.jobs.find_one_and_update(
            write.filter,
            write.update,
            sort=CLAIM_SORT,
            hint=index,
            return_document=ReturnDocument.AFTER,
        )
        return Job.from_doc(doc) if doc is not None else None

    async def claim_many(
        self,
        owner: str,
        lease_seconds: float,
        limit: int,
        *,
        tasks: Collection[str] | None = None,
        queue: str | None = None,
        exclude: Collection[str] = (),
        among: Collection[str] | None = None,
    ) -> tuple[list[Job], bool]:
        """Lease up to `limit` of the best due pending jobs with one write; also say whether
        fewer than `limit` were due (the queue ran dry, as opposed to losing races).

        Concurrent `findOneAndUpdate`s all race for the same first job (write conflicts the
        server retries); this picks the candidates, claims those still pending in a single
        `update_many` tagged with a fresh token, and reads back exactly what it won. Another
        dispatcher may win some of them; it never claims one twice.
        """
        candidates = await self.jobs.find(
            claim_filter(tasks, queue, exclude, among),
            sort=CLAIM_SORT,
            limit=limit,
            hint=claim_index(tasks, queue, among),
        ).to_list()
        if not candidates:
            return [], True
        ids = [d["_id"] for d in candidates]
        tag = secrets.token_hex(8)
        # Each candidate only as it was read (`queries.as_read`): one claimed and handed
        # back, or joined by a debounced submit, meanwhile is not taken here, so a full
        # match means every job is as read.
        write = queries.claimed_as_read(candidates, owner, lease_seconds, tag)
        res = await self.jobs.update_many(write.filter, write.update)
        dry = len(candidates) < limit
        if res.modified_count == len(ids):
            # Won them all (the usual case): every candidate was pending when the update
            # matched it, so its claim took attempt + 1; no read-back needed.
            return [as_claimed(d, owner) for d in candidates], dry
        won = await self.jobs.find(
            {"_id": {"$in": ids}, "claim_tag": tag, "owner": owner, "status": R}
        ).to_list()
        return [Job.from_doc(d) for d in in_claim_order(won)], dry

    async def next_due(
        self,
        *,
        tasks: Collection[str] | None = None,
        queues: Collection[str] | None = None,
        exclude: Collection[str] = (),
        after: datetime | None = None,
    ) -> datetime | None:
        """The earliest `run_at` among pending jobs of these tasks and queues (the
        dispatcher's timer; None: any), but not in `exclude` (queues that cannot start a
        job now: paused, or waiting for a slot or their rate window) and, with `after`, not
        before it (so a backlog already due in those queues is not even scanned)."""
        query: dict[str, Any] = {"status": P}
        if tasks is not None:
            query["task"] = {"$in": sorted(tasks)}
        if queues is not None:
            query["queue"] = {"$in": sorted(set(queues) - set(exclude))}
        elif exclude:
            query["queue"] = {"$nin": sorted(exclude)}
        if after is not None:
            query["run_at"] = {"$gt": after}
        doc = await self.jobs.find_one(
            query, projection={"run_at": 1}, sort=[("run_at", ASCENDING)]
        )
        return doc["run_at"] if doc is not None else None

    async def pending_queues(self) -> set[str]:
        """The queues that hold pending jobs: one distinct scan of `claim_by_queue`, a seek
        per queue. Asked as a `$group` on that index's order with the index named: left to
        itself, the planner answered `distinct("queue", ...)` with a scan of `claim_order`,
        where the queue comes after the priority, the due time and the id, so it read every
        pending job (2.7 s at a million, on the claim path of every queue with limits)."""
        pipeline = list(PENDING_QUEUES)
        docs = await (await self.jobs.aggregate(pipeline, hint="claim_by_queue")).to_list()
        return {str(doc["_id"]) for doc in docs}

    async def candidates(
        self, limit: int, *, tasks: Collection[str] | None, queue: str
    ) -> list[Doc]:
        """The best due pending jobs of these tasks in `queue`, at most `limit`, as `{_id}`:
        what a claim in a limited queue takes its slots for. Read as the primary has them,
        as the plain claim does: a job heard of from the oplog is not majority-committed yet,
        and its insert's change-stream event, which comes later, is not news again."""
        docs: list[Doc] = await self._primary().find(
            claim_filter(tasks, queue),
            projection={"_id": 1},
            sort=CLAIM_SORT,
            limit=limit,
            hint=claim_index(tasks, queue),
        ).to_list()
        return docs

    async def claim_tagged(
        self, owner: str, lease_seconds: float, ids: Sequence[str], tag: str, before: datetime
    ) -> list[Job]:
        """Lease those of these jobs still due and pending, each marked with the claim's `tag`
        (its slots carry it too), but only while the server's clock is before `before` (the
        slots' `claim_by`): after it the slots may have been freed, and no claim may use them.
        What it won is read back: its candidates were read without their payloads (twice as
        many as it claims), and a job may have changed since (a debounced submit joined it)."""
        write = queries.claimed_tagged(ids, owner, lease_seconds, tag, before)
        return (await self._claim_ids(write, ids, owner, tag)).jobs

    async def claim_with_slots(
        self, owner: str, lease_seconds: float, slots: Mapping[str, str | None], tag: str
    ) -> SlotClaim:
        """Lease those of these jobs (by id) still due and pending, each holding its
        `key_slot` (`queries.claimed_with_slots`), tagged with `tag`. A slot held by another
        running job stops the write there: the jobs claimed before it are read back, and the
        slot is named. What it won is read back (its candidates were read without payloads)."""
        write = queries.claimed_with_slots(slots, owner, lease_seconds, tag)
        return await self._claim_ids(write, list(slots), owner, tag)

    async def _claim_ids(
        self, write: queries.Write, ids: Sequence[str], owner: str, tag: str
    ) -> SlotClaim:
        """Run a claim of these jobs by id (`write` tags them with `tag`) and say what it won:
        one job in one retryable round trip; more in one `update_many`, then read back by
        the tag. A `key_slot` another running job holds stops the write there (named)."""
        if not ids:
            return SlotClaim()
        if len(ids) == 1:
            try:
                doc = await self.jobs.find_one_and_update(
                    write.filter, write.update, return_document=ReturnDocument.AFTER
                )
            except DuplicateKeyError as exc:
                return SlotClaim(refused=_held_slot(exc))
            return SlotClaim([Job.from_doc(doc)] if doc is not None else [])
        refused = None
        try:
            await self.jobs.update_many(write.filter, write.update)
        except DuplicateKeyError as exc:
            refused = _held_slot(exc)
        won = await self.jobs.find(
            {"_id": {"$in": list(ids)}, "claim_tag": tag, "owner": owner, "status": R}
        ).to_list()
        return SlotClaim([Job.from_doc(d) for d in in_claim_order(won)], refused)

    async def claim_of_key_slot(
        self,
        owner: str,
        lease_seconds: float,
        queue: str,
        key: str,
        slot: str,
        *,
        tasks: Collection[str] | None = None,
    ) -> SlotClaim:
        """Lease the best due pending job of one key of `queue`, holding `slot` (a new key's
        job, claimed out of turn): one `findOneAndUpdate` on `claim_by_key`."""
        write = queries.claimed_of_key(owner, lease_seconds, queue, key, tasks, slot)
        try:
            job = await self._claim_best(write, "claim_by_key")
        except DuplicateKeyError as exc:
            return SlotClaim(refused=_held_slot(exc))
        return SlotClaim([job] if job is not None else [])

    async def take_slot(self, owner: str, job_id: str, attempt: int, slot: str) -> bool:
        """This owner's running attempt takes `slot` (False: another running job holds it,
        or the attempt is over)."""
        write = queries.slot_taken(owner, job_id, attempt, slot)
        try:
            res = await self.jobs.update_one(write.filter, write.update)
        except DuplicateKeyError as exc:
            _held_slot(exc)
            return False
        return res.modified_count == 1

    def _primary(self) -> AsyncCollection[Doc]:
        """The jobs as the primary has them (local read concern): a job a dispatcher heard
        of from the oplog (before it is majority-committed) is a candidate at once, as
        for the plain claim (a write on the primary); the claim itself is fenced."""
        return self.jobs.with_options(read_concern=ReadConcern("local"))

    async def pending_keys(self, queue: str) -> list[str | None]:
        """The keys with pending jobs in `queue`, jobs without a key under None (one distinct
        scan of `claim_by_key`: a seek per key, however many jobs each has)."""
        keys = await self._primary().distinct("key", {"status": P, "queue": queue})
        return [None, *sorted(str(k) for k in keys if k is not None)]

    async def first_of_keys(
        self, queue: str, keys: Sequence[str], *, tasks: Collection[str] | None
    ) -> dict[str, Doc]:
        """The best pending job of each of `keys` (named keys: not the jobs without one) in
        `queue`, due or not: one distinct scan of `claim_by_key`, a seek per key (a plan
        of its own per key, as `key_candidates` makes, costs the server about eight times
        more at 66 keys). Each as `{_id, key, priority, run_at}`; a key without one is
        left out."""
        if not keys:
            return {}
        pipeline = firsts_of_keys(queue, keys, tasks)
        jobs = self._primary()
        docs = await (await jobs.aggregate(pipeline, hint="claim_by_key")).to_list()
        return {
            str(d["_id"]): {
                "_id": d["id"],
                "key": d["_id"],
                "priority": d["priority"],
                "run_at": d["run_at"],
            }
            for d in docs
        }

    async def key_candidates(
        self, queue: str, keys: Sequence[str | None], per_key: int, *, tasks: Collection[str] | None
    ) -> dict[str | None, list[Doc]]:
        """The best due pending jobs of each of `keys` in `queue`, at most `per_key` each (None:
        the jobs without a key), as `{_id, key, priority}`: one aggregation, one index range
        of `claim_by_key` per key (`$unionWith`), in one round trip however many keys."""
        if not keys:
            return {}

        def best(key: str | None) -> list[dict[str, Any]]:
            return [
                {"$match": {**claim_filter(tasks, queue), "key": key}},
                {"$sort": dict(CLAIM_SORT)},
                {"$limit": per_key},
                {"$project": {"_id": 1, "key": 1, "priority": 1}},
            ]

        pipeline = best(keys[0]) + [
            {"$unionWith": {"coll": JOBS, "pipeline": best(k)}} for k in keys[1:]
        ]
        jobs = self._primary()
        docs = await (await jobs.aggregate(pipeline, hint="claim_by_key")).to_list()
        found: dict[str | None, list[Doc]] = {k: [] for k in keys}
        for doc in docs:
            key = doc.get("key")
            found.setdefault(str(key) if key is not None else None, []).append(doc)
        return found

    async def oldest_due(
        self,
        limit: int,
        *,
        tasks: Collection[str] | None,
        queue: str | None = None,
        exclude: Collection[str] = (),
        among: Collection[str] | None = None,
    ) -> list[Doc]:
        """The `limit` due pending jobs that have waited longest (priority aging's look: the
        `due` index, in due order)."""
        cursor = self.jobs.find(
            claim_filter(tasks, queue, exclude, among),
            projection={"priority": 1, "run_at": 1},
            sort=[("run_at", ASCENDING)],
            limit=limit,
        )
        if tasks is not None and len(tasks) <= queries.MAX_MERGED_SCANS:
            cursor = cursor.hint("due")
        return await cursor.to_list()

    async def best_priority(
        self,
        *,
        tasks: Collection[str] | None,
        queue: str | None = None,
        exclude: Collection[str] = (),
        among: Collection[str] | None = None,
    ) -> int | None:
        """The stored priority of the job a claim would take now (None: none is due)."""
        doc = await self.jobs.find_one(
            claim_filter(tasks, queue, exclude, among),
            projection={"priority": 1},
            sort=CLAIM_SORT,
            hint=claim_index(tasks, queue, among),
        )
        return int(doc.get("priority", 0)) if doc is not None else None
