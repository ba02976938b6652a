"""Spawned jobs in the jobs collection: the jobs a task submitted with `ctx.submit` carry
`spawned_by` (its job's id), and a cancel reaches them down the tree
(`brook.common.client.spawned` walks it; `brook.common.store.queries.spawned` builds the
writes). Every read here uses the index `spawned` (the jobs that have a `spawned_by`) or
`spawn_cancelling` (the jobs marked `spawn_cancel`), so jobs that spawned nothing cost
none of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pymongo import DESCENDING

from brook.common.domain.models import Doc, Job
from brook.common.store import queries
from brook.common.store.jobs.base import JobsCollection
from brook.common.store.queries import ENDED
from brook.common.store.queries.listing import prefix_range

# What a propagation reads of each spawned job, and of the ones it changed.
CHILD_FIELDS = {"status": 1, "cancel_requested": 1}
CHANGED_FIELDS = {
    "task": 1,
    "attempts": 1,
    "status": 1,
    "has_dependents": 1,
    "spawned_by": 1,
    "error": 1,
}


class JobSpawned(JobsCollection):
    """Spawned jobs, and the cancel that reaches them."""

    async def spawned_children(self, parent_ids: Sequence[str]) -> list[Doc]:
        """Every job these jobs spawned (finished ones too: theirs may still run), with its
        status and whether it was asked to stop."""
        if not parent_ids:
            return []
        return await self.jobs.find(
            # `$type` says what the partial index holds, so the hint is always valid.
            {"spawned_by": {"$in": list(parent_ids), "$type": "string"}},
            projection=CHILD_FIELDS,
            hint="spawned",
        ).to_list()

    async def mark_spawn_cancel(self, job_ids: Sequence[str]) -> None:
        """Mark jobs whose spawned jobs are being cancelled (before the first of them is):
        a propagation that dies midway leaves them to the sweep."""
        write = queries.spawn_cancel_marked(job_ids)
        await self.jobs.update_many(write.filter, write.update)

    async def cancel_spawned(self, ids: Sequence[str], tag: str) -> list[Doc]:
        """Cancel these spawned jobs (`ParentCancelled`): waiting or pending ones at once,
        running ones asked to stop; the jobs it changed, each as it is now."""
        out: list[Doc] = []
        for write in (
            queries.spawned_cancelled(ids, self.retention_s, tag),
            queries.spawned_cancel_requested(ids, tag),
        ):
            res = await self.jobs.update_many(write.filter, write.update)
            if res.modified_count:
                seen = {d["_id"] for d in out}
                found = await self.jobs.find(
                    {"_id": {"$in": list(ids)}, "bulk_op": tag}, projection=CHANGED_FIELDS
                ).to_list()
                out += [d for d in found if d["_id"] not in seen]
        return out

    async def spawn_cancel_done(self, job_ids: Sequence[str]) -> None:
        """Take the mark off these jobs, those that have ended."""
        if job_ids:
            write = queries.spawn_cancel_done(job_ids)
            await self.jobs.update_many(write.filter, write.update)

    async def spawn_cancels_left(self, limit: int = 1000) -> list[str]:
        """Ended jobs still marked `spawn_cancel`: a propagation from them was cut short, or
        they were running when it passed (the sweep goes down from them again)."""
        docs = await self.jobs.find(
            {"spawn_cancel": True, "status": {"$in": ENDED}},
            projection={"_id": 1},
            limit=limit,
            hint="spawn_cancelling",
        ).to_list()
        return [str(d["_id"]) for d in docs]

    async def list_spawned(
        self,
        spawned_by: str,
        *,
        filters: Mapping[str, str] | None = None,
        limit: int = 50,
        after: str | None = None,
        error: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> tuple[list[Job], str | None]:
        """The jobs `spawned_by` spawned, newest first (`GET /jobs?spawned_by=`), with the
        listing's other equality `filters` (`status`, `task`, `queue`, `key`), its `error`
        type prefix and its `since`/`until` on `created_at`, read on top of the index;
        `after` is the `next` cursor of the previous page."""
        query: dict[str, Any] = {"spawned_by": {"$eq": spawned_by, "$type": "string"}}
        query.update({k: {"$eq": v} for k, v in (filters or {}).items()})
        if error is not None:
            query["error.type"] = prefix_range(error)
        created = {op: at for op, at in (("$gte", since), ("$lt", until)) if at is not None}
        if created:
            query["created_at"] = created
        if after is not None:
            query["_id"] = {"$lt": after}
        cursor = self.jobs.find(query, hint="spawned").sort("_id", DESCENDING).limit(limit + 1)
        docs = await cursor.to_list()
        jobs = [Job.from_doc(d) for d in docs[:limit]]
        return jobs, jobs[-1].id if len(docs) > limit else None
