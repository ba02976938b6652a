"""`brook.ingest.metrics.DepthCache`: counts served from memory, kept fresh in the background."""

from __future__ import annotations

import asyncio

from brook.common.runtime.metrics import MAX_QUEUE_LABELS, queue_label
from brook.ingest.metrics import DepthCache, fold_queues


class SlowStore:
    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def count_by_queue(self) -> dict[str, dict[str, int]]:
        self.calls += 1
        await self.gate.wait()
        return {"default": {"pending": self.calls}}


async def test_requests_share_one_count_and_are_then_served_from_memory() -> None:
    store = SlowStore()
    counts = DepthCache(store, ttl=60)  # type: ignore[arg-type]
    try:
        first = await asyncio.gather(*(counts.get() for _ in range(5)))
        assert store.calls == 1 and all(c["default"]["pending"] == 1 for c in first)
        assert (await counts.get())["default"]["pending"] == 1 and store.calls == 1
    finally:
        counts.close()


async def test_counts_are_refreshed_in_the_background_while_requests_come() -> None:
    store = SlowStore()
    counts = DepthCache(store, ttl=0.1)  # type: ignore[arg-type]
    try:
        assert (await counts.get())["default"]["pending"] == 1
        await asyncio.sleep(0.35)  # the loop recounts every 100 ms meanwhile
        assert store.calls >= 3
        store.gate.clear()  # a count that takes as long as it takes ...
        await asyncio.sleep(0.05)
        served = await asyncio.wait_for(counts.get(), 0.01)  # ... is not waited for
        assert served["default"]["pending"] >= 3
    finally:
        store.gate.set()
        counts.close()


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
    assert counts.interval() == 30.0
    counts.close()


async def test_figures_older_than_two_intervals_are_waited_for() -> None:
    now = [0.0]
    store = SlowStore()
    counts = DepthCache(store, ttl=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    await counts.get()
    counts.close()  # no background loop: the figures age
    await asyncio.sleep(0)
    now[0] = 1.5
    assert (await counts.get())["default"]["pending"] == 1  # within two intervals: memory
    counts.close()
    await asyncio.sleep(0)
    now[0] = 2.5
    assert (await counts.get())["default"]["pending"] == 2  # older: a fresh count
    counts.close()


def test_queue_labels_are_capped_and_the_rest_folded_into_other() -> None:
    depth = {f"q{i:03}": {"pending": i} for i in range(200)}
    depth["default"] = {"pending": 1}
    folded = fold_queues(depth)
    assert len(folded) == MAX_QUEUE_LABELS
    assert "default" in folded and "q199" in folded and "q000" not in folded
    assert sum(c["pending"] for c in folded.values()) == sum(c["pending"] for c in depth.values())
    assert fold_queues({"default": {"pending": 1}}) == {"default": {"pending": 1}}
    labels = {queue_label(f"dispatcher-q{i}") for i in range(200)}
    assert len(labels) <= MAX_QUEUE_LABELS and "other" in labels
    assert queue_label("default") == "default"
