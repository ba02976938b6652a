"""One reader's output stream as server-sent events: the job's chunks from a position on,
from the collection first, then live from the hub, then `end`.

Events: `output` (one per chunk: `{"attempt", "seq", "kind", "data"}` and `step` inside a
step), `attempt` (`{"attempt"}`, before the first chunk of each attempt's output), `end`
(`{"status"}`: the job's terminal status; the stream closes). An event's `id:` is its
position, `"{attempt}-{seq}"` (an `attempt` event's is its attempt and the sequence number
before its first chunk), so `Last-Event-ID` resumes right after it. A job's last chunks
are written before its end is recorded, so once the end is seen, one more read of the
collection gets everything.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from sse_starlette import ServerSentEvent

from brook.common.domain.models import Doc
from brook.common.domain.output import as_text, format_position
from brook.common.domain.status import TERMINAL
from brook.common.store.output import OutputStore
from brook.ingest.feeds import SEP
from brook.ingest.output_hub import OutputHub, OutputReader

PAGE = 500  # chunks read from the collection at a time
ENDED = frozenset(s.value for s in TERMINAL)


def _sse(**fields: Any) -> ServerSentEvent:
    return ServerSentEvent(sep=SEP, **fields)


@dataclass(kw_only=True)
class OutputFeed:
    hub: OutputHub
    store: OutputStore
    reader: OutputReader
    attempt: int | None = None  # `?attempt=N`: that attempt's chunks only
    last_attempt: int | None = None
    last_seq: int = 0

    async def events(self) -> AsyncIterator[ServerSentEvent]:
        try:
            status = await self.store.status(self.reader.job_id)
            while True:
                async for event in self._drain():
                    yield event
                if status in ENDED:
                    yield self._end(str(status))
                    return
                status = None
                async with contextlib.aclosing(self._live()) as live:
                    async for step in live:
                        if isinstance(step, str):  # the job's status: read the collection now
                            status = step
                            break
                        yield step
        finally:
            self.hub.unsubscribe(self.reader)

    async def _live(self) -> AsyncGenerator[ServerSentEvent | str]:
        """Chunks from the hub, in order; then, when the collection must be read (a chunk
        out of order, a gap, the job's end), the job's status (`""` if it goes on)."""
        while True:
            item = await self.reader.get()
            if item.kind == "end":
                yield str(item.status)
                return
            if item.kind == "gap":  # the hub reopened its stream, or this reader fell behind
                await self.hub.ready.wait()
                yield str(await self.store.status(self.reader.job_id))
                return
            assert item.doc is not None
            if not self._wanted(item.doc):
                continue
            if int(item.doc["seq"]) != self.last_seq + 1:
                yield ""
                return
            for event in self._chunk(item.doc):
                yield event

    def _wanted(self, doc: Doc) -> bool:
        if int(doc["seq"]) <= self.last_seq:
            return False
        return self.attempt is None or doc.get("attempt") == self.attempt

    async def _drain(self) -> AsyncIterator[ServerSentEvent]:
        """What the collection holds after this reader's position."""
        while True:
            docs = await self.store.read(
                self.reader.job_id, self.last_seq, attempt=self.attempt, limit=PAGE
            )
            for doc in docs:
                for event in self._chunk(doc):
                    yield event
            if len(docs) < PAGE:
                return

    def _chunk(self, doc: Doc) -> list[ServerSentEvent]:
        attempt, seq = int(doc["attempt"]), int(doc["seq"])
        events = []
        if attempt != self.last_attempt:
            events.append(
                _sse(
                    event="attempt",
                    id=format_position(attempt, seq - 1),
                    data=json.dumps({"attempt": attempt}),
                )
            )
        self.last_attempt, self.last_seq = attempt, seq
        events.append(
            _sse(event="output", id=format_position(attempt, seq), data=json.dumps(chunk_view(doc)))
        )
        return events

    def _end(self, status: str) -> ServerSentEvent:
        return _sse(event="end", data=json.dumps({"status": status}))


def chunk_view(doc: Doc) -> dict[str, Any]:
    """A chunk as readers see it."""
    view = {
        "attempt": doc["attempt"],
        "seq": doc["seq"],
        "kind": doc["kind"],
        "data": doc["data"],
    }
    if doc.get("step") is not None:
        view["step"] = doc["step"]
    if doc.get("emitted_at") is not None:
        view["emitted_at"] = doc["emitted_at"]
    return view


async def output_text(store: OutputStore, job_id: str, attempt: int | None) -> AsyncIterator[str]:
    """`?format=text`: the output so far, text chunks as they are, JSON ones a line each."""
    last = 0
    while True:
        docs = await store.read(job_id, last, attempt=attempt, limit=PAGE)
        if docs:
            yield "".join(as_text(d["kind"], d["data"]) for d in docs)
            last = int(docs[-1]["seq"])
        if len(docs) < PAGE:
            return
