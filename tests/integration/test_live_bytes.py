"""The live hub in bytes: big jobs pass through it without their payloads and results, its
ring keeps within its byte budget, and no change event of a big job goes over MongoDB's
16 MiB limit."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson

from brook.common.domain.models import JobSpec
from brook.common.store.jobs import JobStore, Lease
from brook.ingest.live import EVENT_OVERHEAD, EventFilter, Hub, LiveEvent
from tests.integration.test_live import OWNER, feed, started, stopped, take


class Measured(Hub):
    """The hub, noting the most bytes its ring held after each event it kept, and the
    biggest change the server sent it."""

    peak = 0
    biggest = 0

    async def _take(self, change: Mapping[str, Any], full: bool) -> None:
        self.biggest = max(self.biggest, len(bson.encode(change)))
        await super()._take(change, full)

    def _publish(self, event: LiveEvent) -> None:
        super()._publish(event)
        self.peak = max(self.peak, self.ring_used()[1])


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def job_doc(i: int, payload: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A pending job as the store writes one, inserted around it (the raw driver)."""
    return {
        "_id": f"big-{i:05d}",
        "task": "noop",
        "payload": payload,
        "status": "pending",
        "queue": "default",
        "priority": 0,
        "attempts": 0,
        "max_attempts": 3,
        "run_at": now,
        "created_at": now,
        "updated_at": now,
        "history": [{"status": "pending", "at": now, "attempt": 0}],
    }


async def test_the_rings_bytes_stay_within_budget_while_2000_jobs_of_900_kb_pass(
    store: JobStore,
) -> None:
    budget = 1024 * 1024  # under what 2,000 events take even without their payloads
    hub = Measured(store, buffer=5000, ring_bytes=budget)
    task = await started(hub)
    sub = hub.subscribe(EventFilter(task="noop"))
    payload = {"blob": "x" * 900_000}  # one string, shared by every document sent
    gc.collect()
    rss_before = rss_bytes()
    seen: list[int] = []

    async def drain() -> None:
        while len(seen) < 2000:
            event = await sub.next(30)
            assert event is not None, f"{len(seen)} events, then nothing for 30 s"
            seen.append(len(event.data))

    try:
        draining = asyncio.create_task(drain())
        now = datetime.now(UTC)
        for start in range(0, 2000, 50):  # 45 MB a write, majority-acknowledged
            await store.jobs.insert_many([job_doc(i, payload, now) for i in range(start, start + 50)])
        await asyncio.wait_for(draining, 120)
        count, used = hub.ring_used()
        # The server sent the changes without their payloads, and the events carry the
        # jobs without them: a few kB each, not 900.
        assert hub.biggest < 8 * 1024 and max(seen) < 8 * 1024, (hub.biggest, max(seen))
        # The ring kept within its bytes all along, and they, not its 2,000 slots, bound it.
        assert 0 < hub.peak <= budget and used <= budget
        assert count < 2000
        # What it counts is what it holds.
        held = sum(sys.getsizeof(e.data) for e in hub._ring)
        assert used == held + EVENT_OVERHEAD * count
        gc.collect()
        # 1.8 GB went by: the process kept a small part of one write's worth of it.
        assert rss_bytes() - rss_before < 256 * 1024 * 1024
    finally:
        hub.unsubscribe(sub)
        await stopped(task)


async def test_a_completion_too_big_for_one_change_event_reaches_its_clients(
    store: JobStore,
) -> None:
    hub = Hub(store, buffer=100)
    task = await started(hub)
    try:
        job = (await store.submit(JobSpec(task="noop", payload={}))).job
        await store.jobs.update_one({"_id": job.id}, {"$set": {"payload": {"p": "p" * 7_000_000}}})
        claimed = (await store.claim(OWNER, 30)).job
        assert claimed is not None and claimed.id == job.id
        plain = feed(hub, store, job_id=job.id).events(None)
        asked = feed(hub, store, job_id=job.id, include=frozenset({"result"})).events(None)
        [running] = await take(plain, 1)
        await take(asked, 1)
        # 8 MB of result beside 7 MB of payload: the event's update and post-image each
        # hold the result, 23 MB together, over the 16 MiB a change event may be.
        result = "r" * 8_000_000
        done = await store.complete_many(OWNER, [(Lease(job_id=job.id, attempt=1), result)])
        assert done.done == {job.id}
        [completed] = await take(plain, 1, timeout=30)
        assert json.loads(str(completed.data))["status"] == "completed"
        assert len(str(completed.data)) < 8 * 1024  # no payload, no result
        [with_result] = await take(asked, 1, timeout=30)
        whole = json.loads(str(with_result.data))
        assert (whole["status"], whole["result"] == result) == ("completed", True)
        assert "payload" not in whole  # only what was asked for
        for stream in (plain, asked):
            with contextlib.suppress(StopAsyncIteration):
                await anext(stream)  # a per-job stream ends after its terminal state
        assert json.loads(str(running.data))["status"] == "running"
    finally:
        await stopped(task)
