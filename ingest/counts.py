"""Jobs by queue and status for `GET /metrics` and `GET /queues`: one aggregation, served
from memory, refreshed in the background.

Counting is linear in the jobs collection (116 ms at 500,000 pending jobs when every
request ran it), so no request waits on it, but the first one after start: a request that
finds the figures older than their refresh interval starts one refresh in the background
and gets the figures it has. The interval is at least `MIN_AGE_S`, and at least
`COST_FACTOR` times as long as the last aggregation took, so however large the collection
grows, counting costs MongoDB at most about a tenth of its time, and only while someone
asks. Concurrent requests share the refresh in flight.
"""

from __future__ import annotations

import asyncio
import time

from pymongo.errors import PyMongoError

from common.events import Event, emit
from common.status import JobStatus
from common.store import JobStore
from common.supervision import spawn_logged

MIN_AGE_S = 1.0
COST_FACTOR = 10.0

ByQueue = dict[str, dict[str, int]]


class JobCounts:
    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._value: ByQueue | None = None
        self._at = -float("inf")  # time.monotonic() of the figures
        self._took = 0.0
        self._refresh: asyncio.Task[None] | None = None
        self._failed: PyMongoError | None = None

    async def by_queue(self) -> ByQueue:
        """Jobs per queue and status (queues in name order), at most a refresh interval old
        (older while MongoDB cannot answer: the last figures stand until it can)."""
        if self._value is None:
            await asyncio.shield(self._refreshing())
            if self._value is None:
                assert self._failed is not None
                raise self._failed
        elif time.monotonic() - self._at > max(MIN_AGE_S, COST_FACTOR * self._took):
            self._refreshing()
        return self._value

    async def by_status(self) -> dict[str, int]:
        totals = {s.value: 0 for s in JobStatus}
        for counts in (await self.by_queue()).values():
            for status, n in counts.items():
                totals[status] = totals.get(status, 0) + n
        return totals

    def _refreshing(self) -> asyncio.Task[None]:
        if self._refresh is None or self._refresh.done():
            self._refresh = spawn_logged(self._count(), "job-counts")
        return self._refresh

    async def _count(self) -> None:
        started = time.monotonic()
        try:
            value = await self.store.count_by_queue()
        except PyMongoError as exc:
            self._failed = exc
            emit(Event.MONGO_UNAVAILABLE, level="warning", op="count", error=str(exc)[:200])
            return
        self._took = time.monotonic() - started
        self._value = value
        self._at = time.monotonic()
