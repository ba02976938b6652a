"""`output`: a job's output stream (`ctx.emit`) read by a Python client, straight from
MongoDB as `wait` reads the job: the chunks so far, and with `follow=True` each one as it
is written until the job has ended.

Following reads the job (a majority read, with its cluster time), opens a change stream
on the job's chunks and its end from that time, then reads the collection after the
reader's position: a chunk written before the stream began is in that read, one written
after comes on the stream, so none falls between the two (one in both is recognised by
its sequence number and skipped). A chunk out of order on the stream (one missed, say)
sends the reader back to the collection. A job's last chunks are written before its end
is recorded, so once the end is seen one more read of the collection gets everything.
A failover reopens the stream and goes on from the last chunk given, with no repeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pymongo.errors import PyMongoError

from brook.common.domain.errors import InvalidInput, JobNotFound
from brook.common.domain.models import Doc
from brook.common.domain.output import OutputChunk, parse_position
from brook.common.domain.status import TERMINAL
from brook.common.runtime.backoff import Backoff
from brook.common.store.db import is_transient
from brook.common.store.jobs import JobStore
from brook.common.store.output import OutputStore

PAGE = 500  # chunks read from the collection at a time
ENDED = frozenset(s.value for s in TERMINAL)


class _Position:
    """Where a reader is: the last chunk given (sequence number over every attempt)."""

    def __init__(self, seq: int, attempt: int | None) -> None:
        self.seq = seq
        self.attempt = attempt  # `attempt=N`: only that attempt's chunks are given

    def take(self, doc: Doc) -> OutputChunk | None:
        """The chunk to give for `doc` (the next one in order), or None to skip it."""
        self.seq = int(doc["seq"])
        if self.attempt is not None and doc.get("attempt") != self.attempt:
            return None
        return OutputChunk.from_doc(doc)


class OutputReading:
    """`output`, for `ClientCore` (which provides `_store`)."""

    _store: JobStore

    async def output(
        self,
        job_id: str,
        *,
        follow: bool = False,
        after: str | None = None,
        attempt: int | None = None,
    ) -> AsyncGenerator[OutputChunk]:
        """The job's output, chunk by chunk (`OutputChunk`), in order, every attempt in
        turn (or only `attempt`'s): what was written so far, and with `follow=True` each
        chunk as it is written, ending once the job has ended. `after` is a chunk's
        `position` (`"{attempt}-{seq}"`, an SSE event's `id:`): the stream resumes right
        after it. It follows a change stream, never polling. `JobNotFound` for an unknown
        job, `InvalidInput` for a position this job's stream never had."""
        output = OutputStore(self._store.db)
        at = _Position(await self._start(output, job_id, after), attempt)
        backoff = Backoff(0.1, 2.0)
        while True:
            try:
                async for chunk in self._read(output, job_id, at, follow=follow):
                    yield chunk
                return
            except PyMongoError as exc:
                if not is_transient(exc):
                    raise
                await asyncio.sleep(backoff.next())  # failover: read again from `at`

    async def _start(self, output: OutputStore, job_id: str, after: str | None) -> int:
        if after is None:
            return 0
        position = parse_position(after)
        if position is None:
            raise InvalidInput(f"after={after!r} is not an output position ('ATTEMPT-SEQ')")
        if not await output.issued(job_id, *position):
            if await output.status(job_id) is None:
                raise JobNotFound(job_id)
            raise InvalidInput(f"this job's output never had position {after}")
        return position[1]

    async def _read(
        self, output: OutputStore, job_id: str, at: _Position, *, follow: bool
    ) -> AsyncIterator[OutputChunk]:
        doc, read_at = await self._store.job_doc_now(job_id, {"status": 1})
        if doc is None:
            raise JobNotFound(job_id)
        if not follow or doc.get("status") in ENDED:
            async for chunk in _drain(output, job_id, at):
                yield chunk
            return
        async with await output.watch_job(job_id, start_at=read_at) as stream:
            async for chunk in _drain(output, job_id, at):
                yield chunk
            while True:
                change = await stream.next()
                if change.get("ns", {}).get("coll") != output.output.name:
                    break  # the job ended: its last chunks are in the collection by now
                chunk_doc: dict[str, Any] = change.get("fullDocument") or {}
                seq = int(chunk_doc.get("seq", 0))
                if seq <= at.seq:
                    continue  # given already (read from the collection)
                if seq == at.seq + 1:
                    given = at.take(chunk_doc)
                    if given is not None:
                        yield given
                    continue
                async for chunk in _drain(output, job_id, at):  # a gap: read what it missed
                    yield chunk
        async for chunk in _drain(output, job_id, at):
            yield chunk


async def _drain(output: OutputStore, job_id: str, at: _Position) -> AsyncIterator[OutputChunk]:
    """What the collection holds after the reader's position, in order."""
    while True:
        docs = await output.read(job_id, at.seq, limit=PAGE)
        for doc in docs:
            chunk = at.take(doc)
            if chunk is not None:
                yield chunk
        if len(docs) < PAGE:
            return
