"""The readers of jobs' output: one change stream per API process, fanned out in memory.

`OutputHub.run()` follows one change stream on the database (`OutputStore.watch`): every
chunk inserted into `brook_output` and every job that reached a terminal status. It is open
only while a reader is subscribed (and for `LINGER_S` after the last one left), so an API
process that nobody reads output from holds no cursor for it; 300 readers share the one.
Each chunk is routed to the readers of its job through a bounded queue; a reader that
falls `BROOK_SSE_BUFFER` chunks behind, or any reader while the stream is reopened after an
error, is told it has a gap and reads what it missed from the collection (its feed reads
from the collection first anyway: the stream only carries what comes after).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from pymongo.errors import PyMongoError

from brook.common.domain.models import Doc
from brook.common.runtime.backoff import Backoff
from brook.common.runtime.log_events import Event, log_event
from brook.common.store.output import OUTPUT, OutputStore

LINGER_S = 60.0  # the stream stays open this long after the last reader left
AWAIT_S = 0.2  # a stream without readers notices within about this


@dataclass(frozen=True, kw_only=True)
class Item:
    """What a reader hears: a chunk of its job, its job's end (with its status), or a gap
    (read the collection again)."""

    kind: Literal["chunk", "end", "gap"]
    doc: Doc | None = None
    status: str | None = None


class OutputReader:
    """One reader's queue, for one job."""

    def __init__(self, job_id: str, buffer: int) -> None:
        self.job_id = job_id
        self._buffer = buffer
        self._items: deque[Item] = deque()
        self._ready = asyncio.Event()

    def put(self, item: Item) -> None:
        if item.kind != "end" and len(self._items) >= self._buffer:
            self._items.clear()  # too far behind: read the collection instead
            item = Item(kind="gap")
        self._items.append(item)
        self._ready.set()

    async def get(self) -> Item:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()


class OutputHub:
    def __init__(self, store: OutputStore, buffer: int, linger_s: float = LINGER_S) -> None:
        self.store = store
        self.buffer = buffer
        self.linger_s = linger_s
        self.ready = asyncio.Event()  # the stream is open: what commits from now on is seen
        self._wanted = asyncio.Event()
        self._readers: dict[str, set[OutputReader]] = {}
        self.opened = 0  # streams opened since start (a test's and the metrics' count)

    def count(self) -> int:
        return sum(len(r) for r in self._readers.values())

    def subscribe(self, job_id: str) -> OutputReader:
        reader = OutputReader(job_id, self.buffer)
        self._readers.setdefault(job_id, set()).add(reader)
        self._wanted.set()
        return reader

    def unsubscribe(self, reader: OutputReader) -> None:
        readers = self._readers.get(reader.job_id)
        if readers is not None:
            readers.discard(reader)
            if not readers:
                del self._readers[reader.job_id]

    async def run(self) -> None:
        backoff = Backoff(0.1, 5.0)
        while True:
            await self._wanted.wait()
            try:
                await self._follow(backoff)
            except PyMongoError as exc:
                log_event(
                    Event.MONGO_UNAVAILABLE,
                    level="warning",
                    op="output-stream",
                    error=str(exc)[:200],
                )
                self._tell_all(Item(kind="gap"))
                await asyncio.sleep(backoff.next())
            finally:
                self.ready.clear()
            if not self._readers:
                self._wanted.clear()

    async def _follow(self, backoff: Backoff) -> None:
        """Follow the stream while anyone reads (and `linger_s` after)."""
        async with await self.store.watch(AWAIT_S) as stream:
            self.opened += 1
            self.ready.set()
            backoff.reset()
            idle_since: float | None = None
            while True:
                change = await stream.try_next()
                if change is not None:
                    self._route(change)
                if self._readers:
                    idle_since = None
                    continue
                idle_since = idle_since if idle_since is not None else time.monotonic()
                if time.monotonic() - idle_since >= self.linger_s:
                    return

    def _route(self, change: Doc) -> None:
        if (change.get("ns") or {}).get("coll") == OUTPUT:
            doc = change.get("fullDocument") or {}
            for reader in self._readers.get(str(doc.get("job")), ()):
                reader.put(Item(kind="chunk", doc=doc))
            return
        job_id = str((change.get("documentKey") or {}).get("_id"))
        status = ((change.get("updateDescription") or {}).get("updatedFields") or {}).get("status")
        for reader in self._readers.get(job_id, ()):
            reader.put(Item(kind="end", status=str(status)))

    def _tell_all(self, item: Item) -> None:
        for readers in self._readers.values():
            for reader in readers:
                reader.put(item)
