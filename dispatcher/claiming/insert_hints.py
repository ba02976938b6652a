"""Insert hints: hear of a new job as the primary writes it, before the change stream can.

A change stream shows only majority-committed changes, so a new job reaches the
dispatcher one replication round after its insert (~4 ms on an idle local set, far more
under load), and its claim, a second majority write, waits a round of its own. Following
the primary's oplog, the dispatcher hears of the insert as soon as it is written and
sends the claim at once: the claim's replication then overlaps the insert's, and a job
starts about a round sooner.

It changes nothing in what is safe. The claim is the same conditional, majority
acknowledged write, and a task starts only once its claim is acknowledged. An insert
heard early may still be rolled back by a failover: then so is the claim that followed
it (it is later in the same oplog), which fails or, retried on the new primary, finds
nothing. The change stream stays the record: it announces the same insert a moment
later (`Announced` lets the second announcement of one insert pass silently), and
everything else (requeues, cancel requests) comes only from it.

Where the dispatcher may not read the oplog (a user without access to the `local`
database, a shared Atlas tier, a `mongos`), it says so once and goes on with the change
stream alone. `BROOK_OPLOG_HINTS=false` turns hints off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pymongo.errors import OperationFailure, PyMongoError

from brook.common.runtime.backoff import Backoff
from brook.common.runtime.log_events import Event, log_event
from brook.common.store.db import is_transient
from brook.common.store.jobs import JobStore
from brook.common.store.pipelines import oplog_insert_as_change

# Errors that will not go away by asking again: no access to `local`, no oplog to tail
# (a standalone server, a `mongos`). 13 Unauthorized, 20 IllegalOperation, 2 BadValue
# (a tailable cursor on a collection that is not capped), 26 NamespaceNotFound.
UNAVAILABLE_CODES = frozenset({2, 13, 20, 26})
# A job announced by one source and not (yet) by the other is remembered at most this
# long, in announcements: a hint whose stream event never comes (the insert was rolled
# back) or the reverse (the hint cursor was reopening) is forgotten in time.
ANNOUNCED_CAP = 10_000

OnChange = Callable[[Mapping[str, Any]], None]


class Announced:
    """The inserts announced by one source (a hint or the change stream) and not yet by
    the other: the first announcement of an insert is news, the second is not. Only while
    hints flow; without them every stream event is news."""

    def __init__(self, cap: int = ANNOUNCED_CAP) -> None:
        self.cap = cap
        self.active = False
        self._ids: dict[str, None] = {}

    def first(self, job_id: str) -> bool:
        """Whether this is the first announcement of the insert of `job_id`."""
        if not self.active:
            return True
        if job_id in self._ids:
            del self._ids[job_id]
            return False
        self._ids[job_id] = None
        if len(self._ids) > self.cap:
            del self._ids[next(iter(self._ids))]
        return True

    def stop(self) -> None:
        self.active = False
        self._ids.clear()

    def __len__(self) -> int:
        return len(self._ids)


class InsertHints:
    """Follows the primary's oplog for new pending jobs of `tasks` and hands each to
    `on_change` as an insert event (`documentKey`, `fullDocument` with the fields a claim
    decision needs), as the change stream would a moment later."""

    def __init__(
        self,
        store: JobStore,
        tasks: Collection[str],
        announced: Announced,
        on_change: OnChange,
        *,
        max_await_ms: int = 1000,
    ) -> None:
        self.store = store
        self.tasks = tasks
        self.announced = announced
        self.on_change = on_change
        self.max_await_ms = max_await_ms

    async def run(self) -> None:
        backoff = Backoff(0.1, 30.0)
        while True:
            try:
                await self._follow(backoff)
            except OperationFailure as exc:  # `_follow` has stopped the announcements
                if exc.code in UNAVAILABLE_CODES and not is_transient(exc):
                    log_event(
                        Event.HINTS_UNAVAILABLE,
                        level="warning",
                        code=exc.code,
                        error=str(exc)[:300],
                        detail="new jobs are heard of from the change stream alone",
                    )
                    return
                log_event(Event.HINTS_ERROR, level="warning", code=exc.code, error=str(exc)[:300])
            except PyMongoError as exc:  # no primary for now: a failover
                log_event(Event.HINTS_ERROR, level="warning", error=str(exc)[:300])
            await asyncio.sleep(backoff.next())

    async def _follow(self, backoff: Backoff) -> None:
        """From the end of the current primary's oplog: what was written before the cursor
        opened was, or will be, announced by the change stream."""
        cursor = await self.store.new_pending(self.tasks, max_await_ms=self.max_await_ms)
        try:
            self.announced.active = True
            log_event(Event.HINTS_OPENED)
            while cursor.alive:
                async for entry in cursor:
                    backoff.reset()
                    self.on_change(oplog_insert_as_change(entry))
        finally:
            self.announced.stop()
            await cursor.close()
