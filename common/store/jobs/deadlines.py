"""A job's end by one of its bounds, in the jobs collection: the waiting and pending jobs
whose `start_by` or `deadline` passed (found on their indexes, each ended by one fenced
write on the server's clock), when the next bound comes, and the holder's end of a job it
holds past one."""

from __future__ import annotations

from datetime import datetime, timedelta

from pymongo import ReturnDocument

from brook.common.domain.deadlines import Bound, Defaults
from brook.common.domain.models import Job
from brook.common.store import queries
from brook.common.store.jobs.base import JobsCollection
from brook.common.store.queries.deadlines import bound_reads
from brook.common.store.records import Lease, RunTimes


class JobDeadlines(JobsCollection):
    """`start_by` and `deadline` kept."""

    async def past_bounds(
        self, defaults: Defaults, now: datetime, limit: int = 1000
    ) -> list[tuple[str, Bound]]:
        """Waiting and pending jobs whose bound passed by `now` (this process's reading of
        the server clock): each once, by its deadline if both passed, at most `limit` of each
        kind."""
        found: dict[str, Bound] = {}
        for read in bound_reads(defaults, now):
            docs = await self.jobs.find(
                read.filter, {"_id": 1}, hint=read.index, limit=limit
            ).to_list()
            for doc in docs:
                found.setdefault(str(doc["_id"]), read.bound)
        return list(found.items())

    async def next_bound(self, defaults: Defaults) -> datetime | None:
        """The earliest bound of any waiting or pending job (passed ones included)."""
        earliest: datetime | None = None
        for read in bound_reads(defaults):
            doc = await self.jobs.find_one(
                read.filter, {read.sort: 1}, sort=[(read.sort, 1)], hint=read.index
            )
            if doc is None or not isinstance(doc.get(read.sort), datetime):
                continue
            at = doc[read.sort] + timedelta(seconds=read.offset_s)
            earliest = at if earliest is None else min(earliest, at)
        return earliest

    async def end_past_bound(self, job_id: str, bound: Bound, defaults: Defaults) -> Job | None:
        """End a waiting or pending job by `bound` if it passed on the server's clock: the
        job as it ended, or None (it moved on, or its bound has not passed)."""
        if bound == "start_by_passed":
            write = queries.start_by_passed(job_id, defaults, self.retention_s)
        else:
            write = queries.deadline_exceeded(job_id, defaults, self.retention_s)
        doc = await self.jobs.find_one_and_update(
            write.filter, write.update, return_document=ReturnDocument.AFTER
        )
        return None if doc is None else Job.from_doc(doc)

    async def end_held_past_bound(
        self,
        lease: Lease,
        owner: str,
        bound: Bound,
        at: datetime,
        ran: RunTimes | None = None,
    ) -> Job:
        """The holder ends a job it holds past `bound` (at `at`): one not started past its
        `start_by` is cancelled; an attempt past its `deadline` fails the job for good.
        `LeaseLost` if it is no longer held."""
        if bound == "start_by_passed":
            write = queries.held_start_by_passed(lease, owner, at, self.retention_s)
        else:
            write = queries.held_deadline_exceeded(lease, owner, at, self.retention_s, ran)
        return await self.write_held(
            write, f"job {lease.job_id} attempt {lease.attempt} is no longer held by {owner}"
        )
