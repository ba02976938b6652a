"""The server's clock as seen from this process: one `ServerClock` per store, used by every
part that needs the server's time without a round trip (no collection of its own; it reads
the clock with the `hello` command).

Leases, due dates and run times are on the server's clock: a job stamped with this
process's own clock could be due early or late by the hosts' skew. Reading the server's
clock on every use would cost a round trip each, so the offset is measured now and then
(`sync`) and applied to the local clocks.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any, Protocol

from brook.common.domain.models import whole_ms

# How often `read` measures the server clock's offset from this process's, at most.
CLOCK_REFRESH_S = 10.0


class ClockSource(Protocol):
    """Where the server's time is read from (`ServerTime`; a fake one in unit tests)."""

    async def server_now(self) -> datetime: ...


class ServerTime:
    """The server's time now, read with one `hello` (its `localTime`)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def server_now(self) -> datetime:
        hello = await self.client.admin.command("hello")
        now: datetime = hello["localTime"]
        # A wrapped application client may not decode datetimes as aware ones.
        return now if now.tzinfo is not None else now.replace(tzinfo=UTC)


class ServerClock:
    """The server's clock as seen from here: local time plus a measured offset."""

    def __init__(self, source: ClockSource) -> None:
        self.source = source
        self.offset = 0.0  # server clock - local clock, seconds
        self._synced = False
        # Server clock - time.monotonic(): the largest lower bound any reading gave. Times
        # stamped with it (`stamp`) never go backwards, even if a reading moves `offset`
        # back or the local wall clock steps, so the runs this dispatcher records on one
        # worker never overlap; they err early by at most a reading's uncertainty.
        self._mono_offset = -math.inf
        # The lower bound the latest reading gave, and when (monotonic) it was taken: what
        # `read` stamps new jobs with.
        self._latest_offset = 0.0
        self._latest_at = -math.inf

    def now(self) -> float:
        return time.time() + self.offset

    def stamp(self, monotonic: float) -> datetime:
        """The server time at `monotonic` (a `time.monotonic()` reading), for the record."""
        if self._mono_offset == -math.inf:
            return datetime.fromtimestamp(monotonic - time.monotonic() + self.now(), UTC)
        return datetime.fromtimestamp(monotonic + self._mono_offset, UTC)

    async def sync(self) -> None:
        before = time.time()
        server = await self.source.server_now()
        after = time.time()
        mono_after = time.monotonic()
        # The server read its clock (in whole milliseconds) at some moment between `before`
        # and `after`: the offset lies in [lo, hi]. It moves only when outside that range,
        # and only as far as its edge, so a slow round trip (a loaded host) never shifts
        # it, and the start and end times this dispatcher stamps stay in order.
        stamp = server.replace(tzinfo=server.tzinfo or UTC).timestamp()
        self._latest_offset, self._latest_at = stamp - mono_after, mono_after
        self._mono_offset = max(self._mono_offset, self._latest_offset)
        lo, hi = stamp - after, stamp + 0.001 - before
        if not self._synced:
            self.offset = (lo + hi) / 2
            self._synced = True
        elif not lo <= self.offset <= hi:
            self.offset = min(max(self.offset, lo), hi)

    async def read(self) -> datetime:
        """The server's time now, from this process's monotonic clock and the offset the
        latest reading gave, read again at most every CLOCK_REFRESH_S (not one per batch of
        submits), so a step of the local wall clock changes nothing. It errs early, never
        late: the server read its clock at some moment of the round trip, so the offset
        taken is the smallest that reading allows, and a job stamped with it is due when it
        lands."""
        if time.monotonic() - self._latest_at > CLOCK_REFRESH_S:
            await self.sync()
        return whole_ms(datetime.fromtimestamp(time.monotonic() + self._latest_offset, UTC))
