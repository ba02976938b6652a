"""The due-job timer: one timer, on the server's clock, for the earliest due job; firing it
is a reason for the claimer to look for work."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

from pymongo.errors import PyMongoError

from brook.common.store.clock import ServerClock

NextDue = Callable[[], Awaitable[datetime | None]]


class DueTimer:
    """One timer for the earliest due job; firing it is a reason to look for work."""

    def __init__(self, next_due: NextDue, clock: ServerClock, fire: Callable[[], None]) -> None:
        self.next_due = next_due
        self.clock = clock
        self.fire = fire
        self.rearm = True  # after the next empty look, ask the store for the next due time
        self._handle: asyncio.TimerHandle | None = None
        self._at: float | None = None
        self._misses = 0

    def at(self, server_ts: float) -> None:
        if self._at is not None and self._at <= server_ts and self._handle is not None:
            return  # an earlier timer is armed already
        self.cancel()
        self._at = server_ts
        delay = max(server_ts - self.clock.now(), 0.0)
        self._handle = asyncio.get_running_loop().call_later(delay, self._fired)

    async def arm_for_next_due(self) -> None:
        self.rearm = False
        try:
            due = await self.next_due()
        except PyMongoError:
            return  # the sweep re-arms it
        if due is None:
            return
        at = due.timestamp()
        if at <= self.clock.now():
            # Due by our estimate but not claimable: clock estimate off or another dispatcher
            # raced us. Back off a little so this never turns into a busy loop.
            self._misses += 1
            at = self.clock.now() + min(0.005 * 2**self._misses, 1.0)
        else:
            self._misses = 0
        self.at(at)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._at = None

    def _fired(self) -> None:
        self._handle = None
        self._at = None
        self.rearm = True
        self.fire()
