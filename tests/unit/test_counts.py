"""`ingest.counts`: a request never waits on the count but the first one."""

from __future__ import annotations

import asyncio
from typing import Any

import ingest.counts as counts_module
from ingest.counts import JobCounts


class SlowStore:
    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def count_by_queue(self) -> dict[str, dict[str, int]]:
        self.calls += 1
        await self.gate.wait()
        return {"default": {"pending": self.calls}}


async def test_counts_are_served_from_memory_and_refreshed_in_the_background(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(counts_module, "MIN_AGE_S", 0.05)
    store = SlowStore()
    counts = JobCounts(store)  # type: ignore[arg-type]
    first = await asyncio.gather(*(counts.by_queue() for _ in range(5)))
    assert store.calls == 1 and all(c["default"]["pending"] == 1 for c in first)  # shared
    assert (await counts.by_status())["pending"] == 1 and store.calls == 1  # fresh: no count
    await asyncio.sleep(0.06)
    store.gate.clear()  # the next count takes as long as it takes
    stale = await asyncio.wait_for(counts.by_queue(), 0.01)  # no waiting on it
    assert stale["default"]["pending"] == 1 and store.calls == 2
    assert (await asyncio.wait_for(counts.by_queue(), 0.01))["default"]["pending"] == 1
    assert store.calls == 2  # one refresh in flight at a time
    store.gate.set()
    await asyncio.sleep(0.01)
    assert (await counts.by_queue())["default"]["pending"] == 2
