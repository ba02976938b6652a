"""Rerun from a step in the jobs collection: a new job made from a finished one, carrying
the steps it recorded before that step, with their output, linked both ways (`rerun_of`,
`reruns`)."""

from __future__ import annotations

from bson import ObjectId
from pymongo.asynchronous.client_session import AsyncClientSession

from brook.common.domain.errors import JobConflict, JobNotFound
from brook.common.domain.models import Job
from brook.common.domain.reruns import Rerun, steps_before
from brook.common.store import queries
from brook.common.store.jobs.base import JobsCollection
from brook.common.store.output import OutputStore


class _SourceChanged(Exception):
    """The source job left its finished state before the rerun committed."""


class JobReruns(JobsCollection):
    """Reruns."""

    async def rerun(self, source_id: str, rerun: Rerun) -> Job:
        """Make the rerun of `source_id` from `rerun.from_step`, pending and due now; return
        it. One transaction (majority-committed) inserts it with the carried steps, copies
        their output chunks to it and links the source to it, so no dispatcher sees it
        before its carried output is there, and a failure leaves nothing. `JobNotFound`
        for an unknown job; `JobConflict` (the API's 409) for a job that has not
        finished (or was retried meanwhile); `InvalidInput` (422) for one without steps, or
        an unknown step. The step
        the job failed in (`error.step`, never recorded) is known: a rerun from it carries
        every recorded step."""
        source = await self.jobs.find_one({"_id": source_id})
        if source is None:
            raise JobNotFound(source_id)
        status = str(source.get("status"))
        error = source.get("error")
        failed_in = error.get("step") if isinstance(error, dict) else None
        carried = steps_before(
            source_id, status, source.get("steps") or [], rerun.from_step, failed_in
        )
        now = await self.clock.read()
        doc = queries.rerun_job(
            source, str(ObjectId()), rerun.from_step, carried, rerun.payload, now
        )
        # The chunks each carried step emitted: of the attempt that recorded it (0 for a
        # step the source itself carried from an earlier job).
        outputs = {str(s["name"]): int(s.get("attempt", 0)) for s in carried}
        output = OutputStore(self.db)

        async def make(session: AsyncClientSession) -> None:
            await self.jobs.insert_one(doc, session=session)
            link = queries.rerun_linked(source_id, doc["_id"])
            linked = await self.jobs.update_one(link.filter, link.update, session=session)
            if not linked.matched_count:
                raise _SourceChanged
            await output.copy_step_output(source_id, outputs, doc["_id"], session=session)

        async with self.db.client.start_session() as session:
            try:
                await session.with_transaction(make)
            except _SourceChanged:
                raise JobConflict(
                    f"job {source_id} changed while it was being rerun (retried, or deleted): "
                    "only a finished job can be rerun"
                ) from None
        return Job.from_doc(doc)
