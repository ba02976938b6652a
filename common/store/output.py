"""The `brook_output` collection: every job's output stream (`ctx.emit`), one document per
chunk, ordered by the job's sequence number (`{job, seq}`, unique).

Chunks are appended in batches, one transaction for every attempt a worker process has
chunks of. The transaction reads each job (`queries.output.holds`: attempt, owner,
running) and the job's chunks from the one before the batch on; the batches of attempts
that hold their job, and are the next of its stream (`place`), are inserted together. A
zombie attempt's batch is never inserted: read before its lease was lost, its insert and
the next attempt's compete for the same sequence numbers (the unique index), and the
transaction that loses retries and reads again. A batch is never taken twice, and never out
of order.

No batch writes the job itself, but for its count (`output: {chunks, bytes}`): with an
attempt's first batch, then at most once a second (the writer's `COUNT_EVERY_S`), and when
the attempt ends. The count is where the next attempt starts numbering; an earlier
attempt's chunks found past it (written after its last count, before it was killed) are
numbered before the new attempt's.

A job's output goes with the job: `prune` deletes the chunks of jobs that are no longer
there (its retention deleted them), run by every dispatcher from time to time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from pymongo import ASCENDING, IndexModel, UpdateOne
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.errors import LeaseLost
from brook.common.domain.models import Doc
from brook.common.domain.output import Chunk, Placed, place
from brook.common.store import queries
from brook.common.store.db import ensure_indexes
from brook.common.store.fields import session_of
from brook.common.store.jobs.base import JOBS
from brook.common.store.pipelines import output_pipeline
from brook.common.store.records import Lease

OUTPUT = "brook_output"

OUTPUT_INDEXES = [
    IndexModel([("job", ASCENDING), ("seq", ASCENDING)], name="output_order", unique=True),
]

# The most job ids one pass of `prune` looks up at once.
PRUNE_BATCH = 1000


@dataclass(frozen=True, kw_only=True)
class AttemptOutput:
    """One attempt's chunks to append, their sequence numbers consecutive as its worker
    numbered them. `count`: write the job's count of its output with them (its bytes before
    this batch: `bytes_before`). `check`: see below."""

    lease: Lease
    owner: str
    chunks: Sequence[Chunk]
    count: bool = True
    bytes_before: int = 0
    # Read the job's chunks from the one before the batch on (`place`). A writer whose
    # last batch of this attempt was written, and said so, knows what is there: only an
    # attempt's first batch after an earlier one's output, or a batch after a write whose
    # answer was lost, needs it. Whatever it says, two attempts' inserts of one sequence
    # number still meet on the unique index.
    check: bool = True

    @property
    def key(self) -> tuple[str, int]:
        return self.lease.job_id, self.lease.attempt


@dataclass(frozen=True, kw_only=True)
class Appended:
    """What became of an attempt's batch: `written` (else its attempt no longer holds the
    job, or the batch is not the next one: nothing of it was inserted), the sequence number
    of its last chunk, what `Placed` says of it (`skip`, `moved`, `moved_bytes`), and
    whether the job's count was written with it."""

    written: bool
    last_seq: int = 0
    skip: int = 0
    moved: int = 0
    moved_bytes: int = 0
    counted: bool = False


LOST = Appended(written=False)


def chunk_doc(batch: AttemptOutput, chunk: Chunk, seq: int) -> Doc:
    doc: Doc = {
        "job": batch.lease.job_id,
        "seq": seq,
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
        """Append each attempt's chunks in one transaction (one majority commit); what became
        of each (`Appended`)."""
        await self.ensure_indexes()
        async with self.db.client.start_session() as session:

            async def append(s: AsyncClientSession) -> dict[tuple[str, int], Appended]:
                return await self._append(s, batches)

            return await session.with_transaction(append)

    async def _append(
        self, session: AsyncClientSession, batches: Sequence[AttemptOutput]
    ) -> dict[tuple[str, int], Appended]:
        ids = sorted({b.lease.job_id for b in batches})
        jobs = {
            d["_id"]: d
            for d in await self.jobs.find(
                {"_id": {"$in": ids}}, projection=queries.FENCE_FIELDS, session=session
            ).to_list()
        }
        held = [
            b
            for b in batches
            if b.chunks and queries.holds(jobs.get(b.lease.job_id), b.lease, b.owner)
        ]
        near = await self._near(session, [b for b in held if b.check])
        verdict = dict.fromkeys((b.key for b in batches), LOST)
        docs: list[Doc] = []
        counts: list[UpdateOne] = []
        for b in held:
            job_id, attempt = b.key
            first = b.chunks[0].seq
            if b.check:
                at = place(attempt, first, len(b.chunks), near.get(job_id, []))
            else:
                at = Placed(kept=True, first_seq=first)
            if not at.kept:
                continue
            fresh = b.chunks[at.skip :]
            docs += [chunk_doc(b, c, at.first_seq + i) for i, c in enumerate(fresh)]
            last = at.first_seq + len(fresh) - 1
            # Nothing may write the job while the attempt's own transaction is open.
            counted = b.count and session_of(jobs[job_id], attempt) is None
            if counted:
                size = b.bytes_before + at.moved_bytes + sum(c.size for c in b.chunks)
                w = queries.output_counted(b.lease, b.owner, last, size)
                counts.append(UpdateOne(w.filter, w.update))
            verdict[b.key] = Appended(
                written=True,
                last_seq=last,
                skip=at.skip,
                moved=at.moved,
                moved_bytes=at.moved_bytes,
                counted=counted,
            )
        if counts:
            # Read above in this transaction's snapshot: a write to the job since is a write
            # conflict, and the transaction is retried from the start.
            await self.jobs.bulk_write(counts, ordered=False, session=session)
        if docs:
            await self.output.insert_many(docs, ordered=True, session=session)
        return verdict

    async def _near(
        self, session: AsyncClientSession, batches: Sequence[AttemptOutput]
    ) -> dict[str, list[tuple[int, int, int]]]:
        """`(seq, attempt, size)` of each job's chunks from the one before its batch on."""
        near: dict[str, list[tuple[int, int, int]]] = {}
        if not batches:
            return near
        clauses = [{"job": b.lease.job_id, "seq": {"$gte": b.chunks[0].seq - 1}} for b in batches]
        async for d in self.output.find(
            {"$or": clauses},
            projection={"_id": 0, "job": 1, "seq": 1, "attempt": 1, "size": 1},
            session=session,
        ).sort([("job", ASCENDING), ("seq", ASCENDING)]):
            near.setdefault(d["job"], []).append(
                (int(d["seq"]), int(d["attempt"]), int(d.get("size", 0)))
            )
        return near

    async def count(self, lease: Lease, owner: str, chunks: int, size: int) -> bool:
        """Write the job's count of its output (an attempt's last, when its last batch went
        without it); False if the attempt no longer holds the job (or is in its own
        transaction)."""
        w = queries.output_counted(lease, owner, chunks, size)
        return bool((await self.jobs.update_one(w.filter, w.update)).matched_count)

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
