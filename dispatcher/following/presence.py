"""Presence: what this dispatcher runs, published for clients and the API.

A client may submit a task it cannot import; it is checked against the tasks live
dispatchers published here (`brook_dispatchers`). The document is refreshed every
heartbeat (`seen_at`, the server's clock), so a dead dispatcher stops counting as live
within a few lease lengths; a clean shutdown removes it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from pymongo.errors import PyMongoError

from brook.common.runtime.log_events import Event, log_event
from brook.common.store.failover_retry import ride_out
from brook.dispatcher.wiring import Wiring


class Presence:
    def __init__(self, wiring: Wiring) -> None:
        self.settings = wiring.settings
        self.store = wiring.store
        self.owner = wiring.owner
        self.name = wiring.name
        self.tasks = wiring.tasks
        self.queues: Mapping[str, int] | None = wiring.settings.queues

    async def _announce(self) -> None:
        await self.store.presence.announce(
            self.owner,
            name=self.name,
            tasks=self.tasks,
            queues=self.queues,
            lease_seconds=self.settings.lease_seconds,
        )

    async def announce(self) -> None:
        """Publish at start, riding out an unavailable MongoDB."""
        await ride_out("announce", self._announce)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            try:
                if not await self.store.presence.seen(self.owner):
                    await self._announce()  # removed meanwhile (by hand, or long frozen)
            except PyMongoError as exc:
                log_event(
                    Event.MONGO_UNAVAILABLE, level="warning", op="presence", error=str(exc)[:200]
                )

    async def retire(self) -> None:
        """At shutdown, best effort (the caller bounds it in time): otherwise the document
        simply stops being live."""
        with contextlib.suppress(PyMongoError):
            await self.store.presence.retire(self.owner)
