"""Following the jobs collection: change streams (their pipelines: `brook.common.store.pipelines`),
post-images for the API's live events, and the primary's oplog tailed for new pending jobs."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from bson import Timestamp
from pymongo import CursorType
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.cursor import AsyncCursor
from pymongo.errors import CollectionInvalid, OperationFailure
from pymongo.read_concern import ReadConcern

from brook.common.domain.models import Doc
from brook.common.store.jobs.base import JOBS, JobsCollection
from brook.common.store.pipelines import NEW_PENDING_FIELDS, job_status_pipeline, new_pending_oplog


def buffered(stream: AsyncChangeStream[Any]) -> int | None:
    """How many changes `stream` already holds from its last batch: the next `try_next`
    returns one of them without asking the server. PyMongo keeps them in its cursor; read
    defensively (None if that ever moves: unknown)."""
    data = getattr(getattr(stream, "_cursor", None), "_data", None)
    return len(data) if data is not None else None


class JobChanges(JobsCollection):
    """Change streams and the oplog tail on the jobs collection."""

    async def job_changes(
        self, job_id: str, *, max_await_ms: int, start_at: Timestamp | None = None
    ) -> AsyncChangeStream[Doc]:
        """A change stream of one job's status changes and of its deletion (open it with
        `async with`), from the cluster time `start_at` (that of a read of the job, so that
        no change after the read is missed) or from now. It carries only wake-ups: the job
        is read again after each."""
        return await self.jobs.watch(
            job_status_pipeline(job_id),
            max_await_time_ms=max_await_ms,
            start_at_operation_time=start_at,
        )

    async def changes(
        self,
        pipeline: Sequence[Mapping[str, Any]],
        *,
        resume_after: Mapping[str, Any] | None,
        max_await_ms: int,
        full_document: str | None = None,
    ) -> AsyncChangeStream[Doc]:
        """A change stream on the jobs collection (open it with `async with`)."""
        return await self.jobs.watch(
            list(pipeline),
            resume_after=resume_after,
            max_await_time_ms=max_await_ms,
            full_document=full_document,
        )

    async def new_pending(self, tasks: Collection[str], *, max_await_ms: int) -> AsyncCursor[Doc]:
        """A tailable cursor on the primary's oplog, from its end: each pending job of
        `tasks` inserted from now on, as the primary writes it, a replication round before
        a change stream shows it (a stream shows only majority-committed changes). Each
        entry is `{"ts", "o": {"_id", "task", "queue", "run_at", "priority"}}`. A hint, not a
        fact: such an insert may still be rolled back by a failover."""
        oplog = self.db.client.get_database(
            "local", codec_options=self.db.codec_options, read_concern=ReadConcern("local")
        )["oplog.rs"]
        newest = await oplog.find({}, {"ts": 1}).sort("$natural", -1).limit(1).to_list()
        query = new_pending_oplog(
            f"{self.db.name}.{JOBS}", tasks, newest[0]["ts"] if newest else None
        )
        cursor = oplog.find(query, NEW_PENDING_FIELDS, cursor_type=CursorType.TAILABLE_AWAIT)
        return cursor.max_await_time_ms(max_await_ms)

    async def enable_post_images(self) -> None:
        """Have the change stream carry each job as that change left it (a post-image), not
        as a later lookup finds it. Idempotent; creates the collection if need be."""
        try:
            await self.db.command("collMod", JOBS, changeStreamPreAndPostImages={"enabled": True})
        except OperationFailure as exc:
            if exc.code != 26:  # NamespaceNotFound
                raise
            options: dict[str, Any] = {"changeStreamPreAndPostImages": {"enabled": True}}
            try:
                await self.db.create_collection(JOBS, **options)
            except CollectionInvalid:  # a peer created it meanwhile
                await self.enable_post_images()
