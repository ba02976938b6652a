"""The dispatcher's part in workflows: settle the dependents of the jobs it finished, and
sweep for parents whose dependents nobody settled.

After a completion (or a failure or cancel) of a job that has dependents, its children
are settled off the job's path: its worker is free already, and parents that end while a
settle is in flight are settled together in the next one. A settle that cannot be
written (no primary in time) is left to the sweep, as is one whose dispatcher died
between the parent's write and the children's: any dispatcher's sweep settles a finished
parent still marked `unsettled`. A job without dependents costs none of this.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection

from pymongo.errors import PyMongoError

from brook.common.client.dependents import Via, settle
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import Spawn
from brook.common.store.failover_retry import ride_out
from brook.common.store.jobs import JobStore

# How long a settle may ride out a failover (in lease lengths) before the sweep takes over.
SETTLE_LEASES = 2


class Dependents:
    def __init__(self, settings: Settings, store: JobStore, spawn: Spawn) -> None:
        self.settings = settings
        self.store = store
        self._spawn = spawn
        self._pending: dict[Via, set[str]] = {}
        self._settler: asyncio.Task[None] | None = None

    def parents_ended(self, job_ids: Collection[str], via: Via) -> None:
        """These jobs just ended and have dependents: settle them in the background."""
        if not job_ids:
            return
        self._pending.setdefault(via, set()).update(job_ids)
        if self._settler is None or self._settler.done():
            self._settler = self._spawn(self._drain(), "settle")

    async def _drain(self) -> None:
        while self._pending:
            via, job_ids = self._pending.popitem()
            await self._settle(job_ids, via)

    async def _settle(self, job_ids: Collection[str], via: Via) -> None:
        until = time.monotonic() + self.settings.lease_seconds * SETTLE_LEASES
        try:
            await ride_out("settle", lambda: settle(self.store, job_ids, via=via), until=until)
        except PyMongoError as exc:  # not transient; the sweep tries again
            log_event(Event.MONGO_REFUSED, level="error", op="settle", error=str(exc)[:300])

    async def sweep(self) -> int:
        """Settle finished parents whose dependents are still unsettled; how many."""
        parents = await self.store.unsettled_parents()
        if parents:
            await settle(self.store, parents, via="sweep")
        return len(parents)
