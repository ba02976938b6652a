"""The one server clock, without a database."""

from __future__ import annotations


async def test_the_server_clock_offset_moves_only_when_a_reading_rules_it_out() -> None:
    from datetime import UTC, datetime
    from unittest import mock

    from brook.common.store.clock import ServerClock

    class Store:
        server = 0.0

        async def server_now(self) -> datetime:
            return datetime.fromtimestamp(self.server, UTC)

    store = Store()
    clock = ServerClock(store)

    async def read(local_before: float, local_after: float, server: float) -> float:
        store.server = server
        with mock.patch("brook.common.store.clock.time.time", side_effect=[local_before, local_after]):
            await clock.sync()
        return clock.offset

    assert abs(await read(100.0, 100.002, 200.001) - 100.0) < 0.001  # the first reading
    first = clock.offset
    assert await read(110.0, 110.200, 210.150) == first  # a slow reading that allows it
    moved = await read(120.0, 120.002, 220.010)  # the server clock stepped 10 ms ahead
    assert abs(moved - (220.010 - 120.002)) < 1e-6  # to the nearest value the reading allows
