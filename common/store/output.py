"""The `brook_output` collection: every job's output stream (`ctx.emit`), one document per
chunk, ordered by the job's sequence number (`{job, seq}`, unique).

Chunks are appended in batches, one transaction for every attempt a worker process has
chunks of: for each attempt, the fenced write on its job (`queries.output_appended`:
attempt, owner, running, and the job's count of chunks just before the batch), then the
chunks of the attempts whose write matched, inserted together. A zombie attempt's batch
matches nothing and none of its chunks is inserted; a batch is never taken twice, and
never out of order. The job keeps the count (`output: {chunks, bytes}`), which fences the
next batch and is where a new attempt starts.

A job's output goes with the job: `prune` deletes the chunks of jobs that are no longer
there (its retention deleted them), run by every dispatcher from time to time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bson import Timestamp
from pymongo import ASCENDING, IndexModel, UpdateOne
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.errors import LeaseLost
from brook.common.domain.models import Doc
from brook.common.domain.output import Chunk
from brook.common.store import queries
from brook.common.store.db import ensure_indexes
from brook.common.store.jobs.base import JOBS
from brook.common.store.pipelines import output_pipeline
from brook.common.store.records import Lease

OUTPUT = "brook_output"

OUTPUT_INDEXES = [
    IndexModel([("job", ASCENDING), ("seq", ASCENDING)], name="output_order", unique=True),
]

Appended = Literal["written", "lost"]
# The most job ids one pass of `prune` looks up at once.
PRUNE_BATCH = 1000


@dataclass(frozen=True, kw_only=True)
class AttemptOutput:
    """One attempt's chunks to append, their sequence numbers consecutive."""

    lease: Lease
    owner: str
    chunks: Sequence[Chunk]

    @property
    def key(self) -> tuple[str, int]:
        return self.lease.job_id, self.lease.attempt


def chunk_doc(batch: AttemptOutput, chunk: Chunk) -> Doc:
    doc: Doc = {
        "job": batch.lease.job_id,
        "seq": chunk.seq,
        "attempt": batch.lease.attempt,
        "kind": chunk.kind,
        "data": chunk.data,
        "size": chunk.size,
    }
    if chunk.step is not None:
        doc["step"] = chunk.step
    if chunk.emitted_at is not None:
        doc["emitted_at"] = chunk.emitted_at  # the worker's clock: for latency figures only
    return doc


class _SomeLost(Exception):
    """A batch's fenced write matched nothing: the transaction is abandoned."""


class OutputStore:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.db = db
        self.output: AsyncCollection[Doc] = db[OUTPUT]
        self.jobs: AsyncCollection[Doc] = db[JOBS]
        self._indexed = False

    async def ensure_indexes(self) -> None:
        if not self._indexed:
            await ensure_indexes(self.output, OUTPUT_INDEXES)
            self._indexed = True

    # -- writing ------------------------------------------------------------------------

    async def append(self, batches: Sequence[AttemptOutput]) -> dict[tuple[str, int], Appended]:
        """Append each attempt's chunks in one transaction (one majority commit); each
        attempt's verdict: `written`, or `lost` (the attempt no longer holds the job, or its
        batch is not the next one: nothing of it is inserted).

        The fenced writes go in one bulk write; if any matches nothing (rare: a lost lease),
        that transaction is abandoned and a second one writes them one by one, to learn
        which."""
        await self.ensure_indexes()
        async with self.db.client.start_session() as session:

            async def together(s: AsyncClientSession) -> dict[tuple[str, int], Appended]:
                return await self._append(s, batches, one_by_one=False)

            async def one_by_one(s: AsyncClientSession) -> dict[tuple[str, int], Appended]:
                return await self._append(s, batches, one_by_one=True)

            try:
                return await session.with_transaction(together)
            except _SomeLost:
                return await session.with_transaction(one_by_one)

    async def _append(
        self, session: AsyncClientSession, batches: Sequence[AttemptOutput], *, one_by_one: bool
    ) -> dict[tuple[str, int], Appended]:
        writes = [
            queries.output_appended(
                b.lease, b.owner, b.chunks[0].seq, len(b.chunks), sum(c.size for c in b.chunks)
            )
            for b in batches
        ]
        verdict: dict[tuple[str, int], Appended] = {}
        if one_by_one:
            for b, w in zip(batches, writes, strict=True):
                one = await self.jobs.update_one(w.filter, w.update, session=session)
                verdict[b.key] = "written" if one.matched_count else "lost"
        else:
            res = await self.jobs.bulk_write(
                [UpdateOne(w.filter, w.update) for w in writes], ordered=False, session=session
            )
            if res.matched_count != len(batches):
                raise _SomeLost  # aborts this transaction: nothing of it is kept
            verdict = {b.key: "written" for b in batches}
        docs = [chunk_doc(b, c) for b in batches if verdict[b.key] == "written" for c in b.chunks]
        if docs:
            await self.output.insert_many(docs, ordered=True, session=session)
        return verdict

    # -- reading ------------------------------------------------------------------------

    async def read(
        self, job_id: str, after_seq: int = 0, *, attempt: int | None = None, limit: int = 1000
    ) -> list[Doc]:
        """The job's chunks after `after_seq`, in order (of one attempt, with `attempt`)."""
        query: dict[str, Any] = {"job": job_id, "seq": {"$gt": after_seq}}
        if attempt is not None:
            query["attempt"] = attempt
        cursor = self.output.find(query, projection={"_id": 0}).sort("seq", ASCENDING)
        return await cursor.limit(limit).to_list()

    async def issued(self, job_id: str, attempt: int, seq: int) -> bool:
        """Whether `(attempt, seq)` is a position this job's stream has: a chunk's own, or
        the start of an attempt's output (its attempt, and the chunk before its first)."""
        if seq < 0:
            return False
        near = await self.output.find(
            {"job": job_id, "seq": {"$in": [seq, seq + 1]}}, projection={"attempt": 1, "seq": 1}
        ).to_list()
        return any(d.get("attempt") == attempt for d in near)

    async def status(self, job_id: str) -> str | None:
        """The job's status (None: no such job)."""
        doc = await self.jobs.find_one({"_id": job_id}, projection={"status": 1})
        return None if doc is None else str(doc.get("status"))

    async def watch(self, await_s: float) -> AsyncChangeStream[Doc]:
        """Every chunk inserted and every job that ended, from now on: one stream for every
        reader of an API process (`output_pipeline`); a read waits `await_s` at most."""
        await self.ensure_indexes()
        return await self.db.watch(
            output_pipeline(OUTPUT, JOBS), max_await_time_ms=int(await_s * 1000)
        )

    async def watch_job(
        self, job_id: str, *, start_at: Timestamp | None = None, await_ms: int = 5000
    ) -> AsyncChangeStream[Doc]:
        """As `watch`, for one job (a Python client's `output(follow=True)`), from the
        cluster time `start_at` (that of a read of the job: no change after it is missed)
        or from now."""
        await self.ensure_indexes()
        pipeline = [
            *output_pipeline(OUTPUT, JOBS),
            {"$match": {"$or": [{"fullDocument.job": job_id}, {"documentKey._id": job_id}]}},
        ]
        return await self.db.watch(
            pipeline, start_at_operation_time=start_at, max_await_time_ms=await_ms
        )

    # -- copying and retention ----------------------------------------------------------

    async def copy_step_output(
        self,
        source_job: str,
        steps: Mapping[str, int],
        target_job: str,
        *,
        session: AsyncClientSession | None = None,
    ) -> int:
        """Carry finished steps' output to a job that has none yet (a rerun that keeps those
        steps): the chunks `source_job` emitted inside each step of `steps` (name → the
        attempt that recorded it: the step entry's `attempt`), in their order, become the
        first chunks of `target_job`, under attempt 0 ("carried over"), each with
        `carried_from`. Call it before the target can run (with `session`, in the
        transaction that makes it): its first attempt's output goes on after them. Returns
        how many chunks were carried; `LeaseLost` if the target has output already."""
        if not steps:
            return 0
        wanted = [{"step": name, "attempt": attempt} for name, attempt in steps.items()]
        docs = (
            await self.output.find(
                {"job": source_job, "$or": wanted}, projection={"_id": 0}, session=session
            )
            .sort("seq", ASCENDING)
            .to_list()
        )
        if not docs:
            return 0
        carried = [
            {**d, "job": target_job, "seq": i + 1, "attempt": 0, "carried_from": source_job}
            for i, d in enumerate(docs)
        ]
        size = sum(int(d.get("size", 0)) for d in carried)
        res = await self.jobs.update_one(
            {"_id": target_job, "output.chunks": {"$exists": False}},
            {"$set": {"output": {"chunks": len(carried), "bytes": size}}},
            session=session,
        )
        if not res.matched_count:
            raise LeaseLost(f"job {target_job} is missing or has output already: none carried")
        await self.output.insert_many(carried, ordered=True, session=session)
        return len(carried)

    async def prune(self) -> int:
        """Delete the output of jobs that are gone (their retention deleted them); returns
        how many chunks went. Reads the distinct job ids of the output index, and the jobs
        collection for those, a batch at a time."""
        ids = await self.output.distinct("job")
        deleted = 0
        for start in range(0, len(ids), PRUNE_BATCH):
            batch = ids[start : start + PRUNE_BATCH]
            present = {
                d["_id"]
                async for d in self.jobs.find({"_id": {"$in": batch}}, projection={"_id": 1})
            }
            gone = [i for i in batch if i not in present]
            if gone:
                res = await self.output.delete_many({"job": {"$in": gone}})
                deleted += res.deleted_count
        return deleted
