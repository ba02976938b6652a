"""A caller's operations on many jobs of the jobs collection (`brook.common.domain.bulk`): count
the jobs a filter names, and retry or cancel them in pages, each page one read of ids and
one conditional write whose fence is the single-job operation's. A page's jobs are marked
with the operation's tag (`bulk_op`) so the caller can read back exactly what changed."""

from __future__ import annotations

from collections.abc import Sequence

from brook.common.domain.bulk import PAGE, BulkAction, JobFilter
from brook.common.domain.models import Doc
from brook.common.store import queries
from brook.common.store.jobs.base import JobsCollection

# What the caller reads back of the jobs a page changed (to log each, settle dependents).
CHANGED_FIELDS = {"task": 1, "attempts": 1, "status": 1, "queue": 1, "has_dependents": 1}


class JobBulk(JobsCollection):
    """Bulk retry and cancel."""

    async def count_matching(self, f: JobFilter, action: BulkAction) -> int:
        hint = queries.bulk_index(f, action)
        query = queries.bulk_match(f, action)
        if hint is None:
            return await self.jobs.count_documents(query)
        return await self.jobs.count_documents(query, hint=hint)

    async def matching_page(
        self, f: JobFilter, action: BulkAction, skip_ids: Sequence[str] = (), tag: str = ""
    ) -> list[Doc]:
        """Up to a page of the jobs the filter names that the action can still change, but
        those the operation `tag` changed already (a changed job leaves the filter, unless
        it failed again meanwhile: the tag keeps it out), so the next page is the next
        jobs."""
        query = queries.bulk_match(f, action)
        if skip_ids:
            query["_id"] = {"$nin": list(skip_ids)}
        if tag:
            query["bulk_op"] = {"$ne": tag}
        cursor = self.jobs.find(query, projection={"status": 1, "depends_on": 1}, limit=PAGE)
        hint = queries.bulk_index(f, action)
        return await (cursor.hint(hint) if hint is not None else cursor).to_list()

    async def matching_ids(self, f: JobFilter, action: BulkAction) -> list[str]:
        """The ids of every job the filter names that the action can change (a dry run's
        walk down the trees of spawned jobs starts from them)."""
        query = queries.bulk_match(f, action)
        cursor = self.jobs.find(query, projection={"_id": 1})
        hint = queries.bulk_index(f, action)
        docs = await (cursor.hint(hint) if hint is not None else cursor).to_list()
        return [str(d["_id"]) for d in docs]

    async def retry_page(self, ids: Sequence[str], tag: str) -> list[Doc]:
        """Retry these failed or cancelled jobs without parents; the jobs it changed."""
        write = queries.retried_many(ids, tag)
        return await self._tagged(write, tag)

    async def cancel_page(self, ids: Sequence[str], tag: str) -> list[Doc]:
        """Cancel these waiting or pending jobs at once, and ask the running ones to stop;
        the jobs it changed (each as it is now)."""
        changed = await self._tagged(queries.cancelled_many(ids, self.retention_s, tag), tag)
        asked = await self._tagged(queries.cancel_requested_many(ids, tag), tag)
        seen = {d["_id"] for d in changed}
        return changed + [d for d in asked if d["_id"] not in seen]

    async def _tagged(self, write: queries.Write, tag: str) -> list[Doc]:
        res = await self.jobs.update_many(write.filter, write.update)
        if not res.modified_count:
            return []
        ids = write.filter["_id"]["$in"]
        return await self.jobs.find(
            {"_id": {"$in": ids}, "bulk_op": tag}, projection=CHANGED_FIELDS
        ).to_list()
