"""`ctx.emit(data)` in a worker process: chunks kept here briefly, then written in batches.

Each attempt has an `OutputStream`; every stream of this worker process (one attempt, or
the many of a shared worker process) hands its chunks to the process's one `OutputWriter`.
`emit` checks the chunk and the job's cap, numbers it and returns: it never waits on the
database, from an `async def` task or a plain `def` task's thread. The writer's task, on
this process's event loop, takes everything pending and appends it in one transaction
(`OutputStore.append`: one majority commit, each attempt fenced by attempt and owner),
then waits out the rest of its window (`BROOK_OUTPUT_WINDOW_MS`) before the next: at most
one write per window, however many tokens a second the tasks emit. A chunk emitted after
a quiet spell goes at once. The job's count of its output is written with an attempt's
first batch, then at most every `COUNT_EVERY_S`, and when the attempt ends.

An attempt's last chunks are written before its end is reported (`close`, awaited by the
worker before it sends the outcome), and a step's chunks before its checkpoint (`flush`).
A batch fenced out (the attempt lost its lease) is dropped whole, and so is everything the
attempt emits after it: `emit` then raises `LeaseLost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from pymongo.errors import PyMongoError

from brook.common.domain.errors import LeaseLost, OutputLimitExceeded
from brook.common.domain.output import Chunk, check_job_total, encode_chunk
from brook.common.protocol.runner import RunJob
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.runtime.settings import Settings
from brook.common.store.db import database
from brook.common.store.output import Appended, AttemptOutput, OutputStore
from brook.common.store.records import Lease
from brook.executor.clients import process_client

# The step whose function runs now (its chunks are marked with it).
_step: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "brook_output_step", default=None
)
# A running attempt writes its job's count of its output at most this often (and with its
# first and last batch): the count shown while it runs is at most this far behind.
COUNT_EVERY_S = 1.0


@contextlib.contextmanager
def in_step(name: str) -> Iterator[None]:
    token = _step.set(name)
    try:
        yield
    finally:
        _step.reset(token)


class OutputStream:
    """One attempt's output: `emit` from any thread; `flush` and `close` on the loop."""

    def __init__(self, writer: OutputWriter, run: RunJob, settings: Settings) -> None:
        self.writer = writer
        self.run = run
        self.lease = Lease(job_id=run.job_id, attempt=run.attempt)
        self.key = (run.job_id, run.attempt)
        self.max_chunks = settings.output_max_chunks
        self.max_bytes = settings.output_max_bytes
        self.next_seq = run.output_chunks + 1
        self.total_bytes = run.output_bytes
        self.written = 0  # of the chunks emitted, how many are known written
        self.bytes_written = run.output_bytes  # the job's bytes through the last written
        self.last_seq = run.output_chunks  # the sequence number of the last chunk written
        self.counted_seq = run.output_chunks  # what the job's count says
        self.counted_at: float | None = None  # monotonic: when the count was last written
        # Whether what this attempt's stream holds is known here: not at first after an
        # earlier attempt's output, nor after a write whose answer was lost.
        self.known = run.output_chunks == 0
        self.emitted = 0
        self.emitted_bytes = 0
        self.lost = False
        self.closing = False
        self.closed = False
        self.limited = False

    def count_due(self) -> bool:
        """Whether the next batch writes the job's count too."""
        return (
            self.closing
            or self.counted_at is None
            or time.monotonic() - self.counted_at >= self.writer.count_every_s
        )

    def emit(self, data: Any) -> None:
        kind, value, size = encode_chunk(data)
        with self.writer.lock:
            if self.lost:
                raise LeaseLost(
                    f"job {self.run.job_id} attempt {self.run.attempt} no longer holds its "
                    "lease: its output is not kept"
                )
            if self.closed:
                raise RuntimeError("ctx.emit after the attempt ended")
            try:
                check_job_total(
                    self.next_seq, self.total_bytes + size, self.max_chunks, self.max_bytes
                )
            except OutputLimitExceeded as exc:
                if not self.limited:
                    self.limited = True
                    log_event(
                        Event.OUTPUT_LIMIT, level="warning", **job_fields(self.run), error=str(exc)
                    )
                raise
            chunk = Chunk(
                seq=self.next_seq,
                kind=kind,
                data=value,
                size=size,
                step=_step.get(),
                emitted_at=time.time(),
            )
            self.next_seq += 1
            self.total_bytes += size
            self.emitted += 1
            self.emitted_bytes += size
            self.writer.add(self, chunk)

    async def flush(self, *, count: bool = False) -> None:
        """Return once every chunk emitted so far is written (and with `count`, the job's
        count of its output says so); `LeaseLost` if it never will be."""
        await self.writer.flush(self)
        if count:
            await self.writer.count(self)

    async def close(self) -> None:
        """The attempt ends: write what is pending (as long as a lease lasts, at most), then
        stop taking chunks. Logs what the attempt wrote."""
        if self.emitted and not self.lost:
            with self.writer.lock:
                self.closing = True
            try:
                await asyncio.wait_for(self.flush(count=True), self.writer.settle_s)
            except (LeaseLost, TimeoutError) as exc:
                log_event(
                    Event.OUTPUT_DISCARDED,
                    level="warning",
                    **job_fields(self.run),
                    reason=str(exc) or "not written in time",
                )
        with self.writer.lock:
            self.closed = True
        self.writer.forget(self)
        if self.emitted:
            log_event(
                Event.OUTPUT_ENDED,
                **job_fields(self.run),
                chunks=self.emitted,
                bytes=self.emitted_bytes,
                written=not self.lost,
            )


class OutputWriter:
    """This worker process's writer of output: one task on its event loop."""

    def __init__(
        self,
        store: Callable[[], OutputStore],
        window_s: float,
        settle_s: float,
        count_every_s: float = COUNT_EVERY_S,
    ) -> None:
        self._store = store
        self.window_s = window_s
        self.settle_s = settle_s
        self.count_every_s = count_every_s
        self.lock = threading.Lock()
        self._pending: dict[tuple[str, int], list[Chunk]] = {}
        self._streams: dict[tuple[str, int], OutputStream] = {}
        self._waiters: list[tuple[OutputStream, int, asyncio.Future[None]]] = []
        self._armed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.writes = 0  # transactions committed: a test's and the benchmark's count

    def open(self, run: RunJob, settings: Settings) -> OutputStream:
        """An attempt's stream (on this process's event loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new loop (a test's)
            self._loop, self._loop_thread = loop, threading.get_ident()
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(), name="brook-output-writer")
        stream = OutputStream(self, run, settings)
        self._streams[stream.key] = stream
        return stream

    def add(self, stream: OutputStream, chunk: Chunk) -> None:
        """With `lock` held: a chunk to write; wakes the writer if it sleeps."""
        self._pending.setdefault(stream.key, []).append(chunk)
        if not self._armed:
            self._armed = True
            self._poke()

    def forget(self, stream: OutputStream) -> None:
        with self.lock:
            self._pending.pop(stream.key, None)
            self._streams.pop(stream.key, None)

    async def flush(self, stream: OutputStream) -> None:
        target = stream.emitted
        if stream.lost:
            raise LeaseLost(f"job {stream.run.job_id} attempt {stream.run.attempt}: lease lost")
        if stream.written >= target:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((stream, target, done))
        await done

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return
        if threading.get_ident() == self._loop_thread:
            wake.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process ends
                loop.call_soon_threadsafe(wake.set)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            with self.lock:
                self._armed = False
                batch, self._pending = self._pending, {}
            if not batch:
                continue
            started = time.monotonic()
            await self._write(batch)
            await asyncio.sleep(max(0.0, self.window_s - (time.monotonic() - started)))

    async def _write(self, batch: dict[tuple[str, int], list[Chunk]]) -> None:
        attempts = [
            AttemptOutput(
                lease=s.lease,
                owner=s.run.owner,
                chunks=chunks,
                count=s.count_due(),
                bytes_before=s.bytes_written,
                check=not s.known,
            )
            for key, chunks in batch.items()
            if (s := self._streams.get(key)) is not None and not s.lost
        ]
        if not attempts:
            return
        try:
            verdict = await self._store().append(attempts)
        except PyMongoError as exc:
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op="output", error=str(exc)[:200])
            with self.lock:  # back in front of what came since, for the next window
                for key, chunks in batch.items():
                    self._pending[key] = chunks + self._pending.get(key, [])
                    if (s := self._streams.get(key)) is not None:
                        s.known = False  # it may have been written: the next write looks
                self._armed = True
                self._poke()
            return
        self.writes += 1
        for a in attempts:
            stream = self._streams.get(a.key)
            if stream is not None:
                self._settle_batch(stream, a, verdict[a.key])
        self._settle()

    def _settle_batch(self, stream: OutputStream, batch: AttemptOutput, done: Appended) -> None:
        if not done.written:
            with self.lock:
                stream.lost = True
                self._pending.pop(batch.key, None)
            log_event(
                Event.OUTPUT_DISCARDED,
                level="warning",
                **job_fields(stream.run),
                chunks=len(batch.chunks),
                reason="lease lost: another attempt or owner holds the job",
            )
            return
        with self.lock:
            if done.moved:
                # An earlier attempt's last chunks were past the count this attempt began
                # from: its chunks still to write go on after them too.
                stream.next_seq += done.moved
                stream.total_bytes += done.moved_bytes
                self._pending[batch.key] = [
                    replace(c, seq=c.seq + done.moved) for c in self._pending.get(batch.key, [])
                ]
            stream.written += len(batch.chunks)
            stream.known = True
            stream.bytes_written += done.moved_bytes + sum(c.size for c in batch.chunks)
            stream.last_seq = done.last_seq
            if done.counted:
                stream.counted_seq, stream.counted_at = done.last_seq, time.monotonic()

    async def count(self, stream: OutputStream) -> None:
        """The attempt ends with everything written: its job's count says so too."""
        if stream.lost or stream.counted_seq >= stream.last_seq:
            return
        with contextlib.suppress(PyMongoError):  # the next attempt's first batch writes it
            if await self._store().count(
                stream.lease, stream.run.owner, stream.last_seq, stream.bytes_written
            ):
                stream.counted_seq = stream.last_seq

    def _settle(self) -> None:
        left = []
        for stream, target, done in self._waiters:
            if done.done():
                continue
            if stream.lost:
                done.set_exception(
                    LeaseLost(f"job {stream.run.job_id} attempt {stream.run.attempt}: lease lost")
                )
            elif stream.written >= target:
                done.set_result(None)
            else:
                left.append((stream, target, done))
        self._waiters = left


_writer: OutputWriter | None = None


def process_writer(settings: Settings) -> OutputWriter:
    """This process's one writer of output, on its own MongoDB client."""
    global _writer
    if _writer is None:
        store = OutputStore(database(process_client(settings), settings))
        _writer = OutputWriter(
            lambda: store, settings.output_window_ms / 1000, settle_s=settings.lease_seconds
        )
    return _writer
