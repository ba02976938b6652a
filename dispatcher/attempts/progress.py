"""Progress: write what running attempts report, fenced, a few times a second at most.

Workers coalesce `ctx.progress(...)` to one report per attempt every quarter second
(`executor.progress`). Here the newest report per job waits while a write is in flight,
and the next write takes every job's newest report in one `bulk_write`, each fenced by
its own filter (`_id`, attempt, owner, running): a zombie attempt's report — from a
dispatcher that lost its lease while frozen, say — matches nothing and is discarded.
Progress is advisory: a write that fails on an unavailable MongoDB is dropped, and the
next report replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib

from pymongo.errors import PyMongoError

from brook.common.protocol.runner import ProgressReport
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.runtime.supervision import Spawn
from brook.common.store.jobs import JobStore, Lease

# How long an attempt's outcome waits for its last progress write to land first.
SETTLE_S = 1.0


class ProgressKeeper:
    def __init__(self, store: JobStore, owner: str, spawn: Spawn) -> None:
        self.store = store
        self.owner = owner
        self._spawn = spawn
        self._pending: dict[str, ProgressReport] = {}  # job id → newest report not yet sent
        self._in_flight: set[str] = set()
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._writer: asyncio.Task[None] | None = None

    def report(self, report: ProgressReport) -> None:
        """A worker reported (called by the runner); the newest report per job wins."""
        self._pending[report.job_id] = report
        if self._writer is None or self._writer.done():
            self._writer = self._spawn(self._drain(), "progress")

    async def settle(self, job_id: str, timeout: float = SETTLE_S) -> None:
        """Before an attempt's outcome is written: let its last progress land first, so the
        two writes never race (a report landing after the outcome would be refused)."""
        if job_id not in self._pending and job_id not in self._in_flight:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(job_id, []).append(done)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(done), timeout)

    async def _drain(self) -> None:
        while self._pending:
            batch = list(self._pending.values())
            self._pending.clear()
            self._in_flight = {r.job_id for r in batch}
            try:
                await self._write(batch)
            finally:
                self._in_flight = set()
                for r in batch:
                    if r.job_id not in self._pending:
                        for waiter in self._waiters.pop(r.job_id, []):
                            if not waiter.done():
                                waiter.set_result(None)

    async def _write(self, batch: list[ProgressReport]) -> None:
        items = [(Lease(job_id=r.job_id, attempt=r.attempt), r.fraction, r.message) for r in batch]
        try:
            written = await self.store.set_progress_many(self.owner, items)
        except PyMongoError as exc:
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op="progress", error=str(exc)[:200])
            return
        for r in batch:
            if r.job_id not in written:
                log_event(
                    Event.PROGRESS_DISCARDED,
                    level="warning",
                    **job_fields(r),
                    fraction=r.fraction,
                    reason="lease lost: another attempt or owner holds the job",
                )
