"""OutputPruner: a job's output goes with the job. Its retention (the jobs' TTL index)
deletes the job; every `PRUNE_S` each dispatcher deletes the output of jobs that are gone
(`OutputStore.prune`). A job never gets output after it is gone (every append is fenced by
its running attempt), so this never races an append."""

from __future__ import annotations

import asyncio

from pymongo.errors import PyMongoError

from brook.common.runtime.log_events import Event, log_event
from brook.common.store.jobs import JobStore
from brook.common.store.output import OutputStore

PRUNE_S = 60.0


class OutputPruner:
    def __init__(self, store: JobStore, every_s: float = PRUNE_S) -> None:
        self.output = OutputStore(store.db)
        self.every_s = every_s

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.output.prune()
            except PyMongoError as exc:
                log_event(
                    Event.MONGO_UNAVAILABLE, level="warning", op="prune", error=str(exc)[:200]
                )
