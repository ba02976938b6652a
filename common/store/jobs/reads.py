"""Reading the jobs collection: one job, many, a page of a listing, counts, and the raw
documents the API's live events read (no writes here)."""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import datetime
from typing import Any

from bson import Timestamp
from pymongo import ASCENDING, DESCENDING

from brook.common.domain.errors import JobNotFound
from brook.common.domain.models import DEFAULT_QUEUE, Doc, Job
from brook.common.domain.status import JobStatus
from brook.common.store.jobs.base import JobsCollection


class JobReads(JobsCollection):
    """Reads of jobs by id, by listing and by count."""

    async def get(self, job_id: str) -> Job:
        doc = await self.jobs.find_one({"_id": job_id})
        if doc is None:
            raise JobNotFound(job_id)
        return Job.from_doc(doc)

    async def get_many(self, job_ids: Collection[str]) -> dict[str, Job]:
        """The jobs of these ids that exist, by id."""
        docs = await self.jobs.find({"_id": {"$in": list(job_ids)}}).to_list()
        return {d["_id"]: Job.from_doc(d) for d in docs}

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        task: str | None = None,
        queue: str | None = None,
        limit: int = 50,
        after: str | None = None,
        key: str | None = None,
        error: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> tuple[list[Job], str | None]:
        """Newest first; `after` is the `next` cursor of the previous page. The search of
        the dashboard: `key`, `error` (a piece of the error's type or message, any case)
        and `since`/`until` (created at or after / before)."""
        query: dict[str, Any] = {}
        if status is not None:
            query["status"] = status.value
        if task is not None:
            query["task"] = task
        if queue is not None:
            query["queue"] = queue
        if key is not None:
            query["key"] = {"$eq": key, "$type": "string"}  # what `by_key` holds
        if error is not None:
            text = {"$regex": re.escape(error), "$options": "i"}
            query["$or"] = [{"error.message": text}, {"error.type": text}]
        created = {op: at for op, at in (("$gte", since), ("$lt", until)) if at is not None}
        if created:
            query["created_at"] = created
        if after is not None:
            query["_id"] = {"$lt": after}
        cursor = self.jobs.find(query).sort("_id", DESCENDING).limit(limit + 1)
        filters = [name for name in ("status", "task", "queue") if name in query]
        if key is not None:
            cursor = cursor.hint("by_key")
        elif len(filters) == 1:
            # Named, so the plan never depends on the cache: with a million pending jobs,
            # weighing the claim indexes (which hold them all) against this one, on every
            # replanning, is what would make the first page slow.
            cursor = cursor.hint(f"list_{filters[0]}")
        docs = await cursor.to_list()
        jobs = [Job.from_doc(d) for d in docs[:limit]]
        nxt = jobs[-1].id if len(docs) > limit else None
        return jobs, nxt

    async def trace_contexts(self, job_ids: Collection[str]) -> list[dict[str, str]]:
        """The stored trace contexts of these jobs (those that have one), for span links."""
        docs = await self.jobs.find({"_id": {"$in": list(job_ids)}}, {"trace": 1}).to_list()
        return [d["trace"] for d in docs if d.get("trace")]


    async def failure_groups(self, since: datetime | None, limit: int = 50) -> list[Doc]:
        """Jobs with an error (failed, or waiting for a retry), grouped by error type and
        task: how many of each (`failed`, `retrying`) and the latest one, newest groups
        first. Failed jobs are read through the `failures` index (`since`: finished at or
        after); jobs waiting for a retry are pending and few."""
        failed: dict[str, Any] = {"status": "failed"}
        if since is not None:
            failed["finished_at"] = {"$gte": since}
        retrying = {"status": "pending", "error.type": {"$type": "string"}}
        pipeline: list[dict[str, Any]] = [
            {"$match": {"$or": [failed, retrying]}},
            {"$sort": {"updated_at": -1}},
            {
                "$group": {
                    "_id": {"type": "$error.type", "task": "$task"},
                    "failed": {"$sum": {"$cond": [{"$eq": ["$status", "failed"]}, 1, 0]}},
                    "retrying": {"$sum": {"$cond": [{"$eq": ["$status", "pending"]}, 1, 0]}},
                    "latest": {"$first": {"id": "$_id", "error": "$error", "at": "$updated_at"}},
                }
            },
            {"$sort": {"latest.at": -1}},
            {"$limit": limit},
        ]
        return await (await self.jobs.aggregate(pipeline)).to_list()

    async def count_by_status(self) -> dict[str, int]:
        """Jobs per status, in one aggregation."""
        counts = {s.value: 0 for s in JobStatus}
        async for row in await self.jobs.aggregate(
            [{"$group": {"_id": "$status", "n": {"$sum": 1}}}]
        ):
            counts[str(row["_id"])] = int(row["n"])
        return counts

    async def count_by_queue(self) -> dict[str, dict[str, int]]:
        """Jobs per queue and status, in one aggregation; queues in name order."""
        rows = await (
            await self.jobs.aggregate(
                [
                    {
                        "$group": {
                            "_id": {
                                "queue": {"$ifNull": ["$queue", DEFAULT_QUEUE]},
                                "status": "$status",
                            },
                            "n": {"$sum": 1},
                        }
                    }
                ]
            )
        ).to_list()
        counts: dict[str, dict[str, int]] = {}
        for row in rows:
            queue = str(row["_id"]["queue"])
            counts.setdefault(queue, {s.value: 0 for s in JobStatus})
            counts[queue][str(row["_id"]["status"])] = int(row["n"])
        return dict(sorted(counts.items()))

    async def job_doc(self, job_id: str, projection: Doc | None = None) -> Doc | None:
        """The job's stored document, fields this version's `Job` does not know included
        (cut by `projection` when given)."""
        return await self.jobs.find_one({"_id": job_id}, projection)

    async def job_doc_now(
        self, job_id: str, projection: Doc | None = None
    ) -> tuple[Doc | None, Timestamp | None]:
        """The job's stored document and the cluster time it was read at: every change up
        to that time is in it."""
        async with self.db.client.start_session(causal_consistency=True) as session:
            doc = await self.jobs.find_one({"_id": job_id}, projection, session=session)
            return doc, session.operation_time

    async def changed_since(
        self,
        since: datetime,
        *,
        job_id: str | None = None,
        queue: str | None = None,
        task: str | None = None,
        status: JobStatus | None = None,
        limit: int = 500,
        projection: Doc | None = None,
    ) -> list[Doc]:
        """Jobs changed at or after `since`, oldest change first (a client's catch-up after its
        history was lost; rare, and not indexed: it scans what the other filters leave)."""
        query: dict[str, Any] = {"updated_at": {"$gte": since}}
        if job_id is not None:
            query["_id"] = job_id
        if queue is not None:
            query["queue"] = {"$in": [queue, None]} if queue == DEFAULT_QUEUE else queue
        if task is not None:
            query["task"] = task
        if status is not None:
            query["status"] = status.value
        cursor = self.jobs.find(query, projection)
        return await cursor.sort("updated_at", ASCENDING).limit(limit).to_list()
