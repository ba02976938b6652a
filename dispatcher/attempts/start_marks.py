"""`started_at` of long tasks, written while they run.

A claim is a lease, not a start (the job may wait among the jobs claimed ahead), so
`started_at` is the task's real start as this dispatcher measured it. A short task's start costs no
write of its own: it goes with its outcome. A task still running after `MARK_AFTER_S`
gets its start written now, so a long job shows when it started; the starts due together
go in one `bulk_write`, each fenced like every write of a running job (and only where
`started_at` is still null). Like progress, this is advisory: a write that fails on an
unavailable MongoDB is dropped, and the outcome writes the start anyway.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from pymongo.errors import PyMongoError

from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.supervision import Spawn
from brook.common.store.clock import ServerClock
from brook.common.store.jobs import JobStore, Lease

MARK_AFTER_S = 0.5


class StartMarks:
    def __init__(self, store: JobStore, owner: str, clock: ServerClock, spawn: Spawn) -> None:
        self.store = store
        self.owner = owner
        self.clock = clock
        self._spawn = spawn
        self._pending: dict[str, tuple[Lease, datetime]] = {}
        self._writer: asyncio.Task[None] | None = None

    def arm(self, lease: Lease, started: float) -> asyncio.TimerHandle:
        """A task started at `started` (`time.monotonic()`); cancel the handle when it ends."""
        return asyncio.get_running_loop().call_later(MARK_AFTER_S, self._due, lease, started)

    def _due(self, lease: Lease, started: float) -> None:
        self._pending[lease.job_id] = (lease, self.clock.stamp(started))
        if self._writer is None or self._writer.done():
            self._writer = self._spawn(self._drain(), "start-marks")

    async def _drain(self) -> None:
        while self._pending:
            batch = list(self._pending.values())
            self._pending.clear()
            try:
                await self.store.mark_started(self.owner, batch)
            except PyMongoError as exc:
                error = str(exc)[:200]
                log_event(Event.MONGO_UNAVAILABLE, level="warning", op="mark_started", error=error)
