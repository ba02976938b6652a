"""A caller's operations on one job of the jobs collection: cancel it (at once, or by asking
its holder) and retry a finished one."""

from __future__ import annotations

from collections.abc import Sequence

from pymongo import ReturnDocument

from brook.common.domain.errors import JobConflict, JobNotFound
from brook.common.domain.models import Job
from brook.common.domain.status import TERMINAL, JobStatus
from brook.common.store import queries
from brook.common.store.jobs.base import JobsCollection


class JobCommands(JobsCollection):
    """Cancel and retry."""

    async def cancel(self, job_id: str) -> Job:
        """Waiting or pending → cancelled at once; running → `cancel_requested` (its holder
        stops it). A cancelled parent's dependents are the caller's to settle."""
        for _ in range(5):
            write = queries.cancelled(job_id, self.retention_s)
            doc = await self.jobs.find_one_and_update(
                write.filter, write.update, return_document=ReturnDocument.AFTER
            )
            if doc is not None:
                return Job.from_doc(doc)
            asked = queries.cancel_requested(job_id)
            doc = await self.jobs.find_one_and_update(
                asked.filter, asked.update, return_document=ReturnDocument.AFTER
            )
            if doc is not None:
                return Job.from_doc(doc)
            await self._must_be_active(job_id)
        raise JobConflict(f"job {job_id} kept changing state; try again")  # pragma: no cover

    async def _must_be_active(self, job_id: str) -> None:
        current = await self.jobs.find_one({"_id": job_id}, projection={"status": 1})
        if current is None:
            raise JobNotFound(job_id)
        if JobStatus(current["status"]) in TERMINAL:
            raise JobConflict(f"job {job_id} is already {current['status']}")

    async def retry(self, job_id: str, waiting_on: Sequence[str] = ()) -> Job:
        """A failed or cancelled job back to `pending`, due now, with its attempt budget
        renewed and its history kept; any other state is a conflict. With `waiting_on`
        (parents that have not completed) it goes back to `waiting` for them instead."""
        write = queries.retried(job_id, waiting_on)
        doc = await self.jobs.find_one_and_update(
            write.filter, write.update, return_document=ReturnDocument.AFTER
        )
        if doc is not None:
            return Job.from_doc(doc)
        current = await self.jobs.find_one({"_id": job_id}, projection={"status": 1})
        if current is None:
            raise JobNotFound(job_id)
        raise JobConflict(
            f"job {job_id} is {current['status']}; only failed or cancelled jobs can be retried"
        )
