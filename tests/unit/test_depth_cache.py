"""`ingest.metrics.DepthCache`: a request never waits on the count but the first one."""

from __future__ import annotations

import asyncio

from ingest.metrics import DepthCache


class SlowStore:
    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def count_by_queue(self) -> dict[str, dict[str, int]]:
        self.calls += 1
        await self.gate.wait()
        return {"default": {"pending": self.calls}}


async def test_counts_are_served_from_memory_and_refreshed_in_the_background() -> None:
    store = SlowStore()
    counts = DepthCache(store, ttl=0.05)  # type: ignore[arg-type]
    first = await asyncio.gather(*(counts.get() for _ in range(5)))
    assert store.calls == 1 and all(c["default"]["pending"] == 1 for c in first)  # shared
    assert (await counts.get())["default"]["pending"] == 1 and store.calls == 1  # fresh
    await asyncio.sleep(0.06)
    store.gate.clear()  # the next count takes as long as it takes
    stale = await asyncio.wait_for(counts.get(), 0.01)  # no waiting on it
    assert stale["default"]["pending"] == 1 and store.calls == 2
    assert (await asyncio.wait_for(counts.get(), 0.01))["default"]["pending"] == 1
    assert store.calls == 2  # one refresh in flight at a time
    store.gate.set()
    await asyncio.sleep(0.01)
    assert (await counts.get())["default"]["pending"] == 2


async def test_a_cache_of_zero_seconds_counts_for_every_request() -> None:
    store = SlowStore()
    counts = DepthCache(store, ttl=0)  # type: ignore[arg-type]
    assert (await counts.get())["default"]["pending"] == 1
    assert (await counts.get())["default"]["pending"] == 2


async def test_a_slow_count_is_run_at_most_a_tenth_of_the_time() -> None:
    now = [0.0]
    store = SlowStore()
    counts = DepthCache(store, ttl=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    store.gate.clear()
    first = asyncio.ensure_future(counts.get())
    await asyncio.sleep(0.01)  # the count is under way
    now[0] = 3.0  # and takes 3 s
    store.gate.set()
    await first
    now[0] = 3.0 + 29.0  # 29 s later: not yet 10 x 3 s
    await counts.get()
    await asyncio.sleep(0)
    assert store.calls == 1
    now[0] = 3.0 + 30.0
    await counts.get()
    await asyncio.sleep(0.01)
    assert store.calls == 2
