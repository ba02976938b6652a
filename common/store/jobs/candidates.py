"""Where a dispatcher looks for due work in the jobs collection, read without a write: the
next due time (its timer), the queues and keys with pending jobs, a limited or keyed
queue's candidates (what a claim by id takes), and priority aging's look at the oldest due
jobs. The claims themselves are `claims.py`'s."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.read_concern import ReadConcern

from brook.common.domain.models import Doc
from brook.common.store import queries
from brook.common.store.fields import P
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


class JobCandidates(JobsCollection):
    """Reads of due work: where a claim may look, and what it may take."""

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
        # Dates only: a job written by hand with another type there (a string sorts before
        # every date) is no time to wake up at.
        query["run_at"] = {"$gt": after} if after is not None else {"$type": "date"}
        doc = await self.jobs.find_one(
            query, projection={"run_at": 1}, sort=[("run_at", ASCENDING)]
        )
        run_at = doc["run_at"] if doc is not None else None
        return run_at if isinstance(run_at, datetime) else None  # not past year 9999 either

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
        docs: list[Doc] = (
            await self._primary()
            .find(
                claim_filter(tasks, queue),
                projection={"_id": 1},
                sort=CLAIM_SORT,
                limit=limit,
                hint=claim_index(tasks, queue),
            )
            .to_list()
        )
        return docs

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
