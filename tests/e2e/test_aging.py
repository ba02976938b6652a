"""Priority aging with a real dispatcher: under a constant stream of priority-10 jobs, a
priority-0 job starts within the bound docs/queues.md states, and without aging it waits
behind the stream."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from brook.common.domain.models import JobSpec
from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster

AGING_S = 0.25


async def stream(store: JobStore, stop: asyncio.Event, per_s: float) -> None:
    """Priority-10 jobs, `per_s` a second, until `stop`."""
    spec = JobSpec(task="sleep", payload={"seconds": 0.05}, priority=10)
    while not stop.is_set():
        await store.submit_many([spec] * max(1, int(per_s / 10)))
        await asyncio.sleep(0.1)


async def starved_job(
    cluster: Cluster, store: JobStore, **env: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    cluster.dispatcher(BROOK_CONCURRENCY="2", **env)
    stop = asyncio.Event()
    # Two workers run about 40 such jobs a second: 80 a second keeps a backlog growing.
    feeder = asyncio.create_task(stream(store, stop, per_s=80))
    try:
        await asyncio.sleep(1.0)
        low = (await store.submit(JobSpec(task="noop", payload={}, priority=0))).job.id
        for _ in range(200):  # at most 20 s
            doc = await store.jobs.find_one({"_id": low})
            assert doc is not None
            if doc.get("started_at") is not None:
                break
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await feeder
    others = await store.jobs.find({"priority": 10}).to_list()
    final = await store.jobs.find_one({"_id": low})
    assert final is not None
    return final, others


async def test_a_priority_0_job_passes_a_stream_of_priority_10_jobs_within_the_aging_bound(
    cluster: Cluster, store: JobStore
) -> None:
    low, stream_jobs = await starved_job(
        cluster, store, BROOK_PRIORITY_AGING_SECONDS=str(AGING_S)
    )
    assert low["started_at"] is not None, "the priority-0 job never started"
    # The bound: no priority-10 job due more than (10 - 0 + 1) x the interval after it
    # starts before it (plus one check interval and the claims in flight then).
    bound = low["run_at"] + timedelta(seconds=11 * AGING_S + 2 * AGING_S + 0.5)
    passed = [
        d
        for d in stream_jobs
        if d.get("started_at") is not None
        and d["started_at"] < low["started_at"]
        and d["run_at"] > bound
    ]
    assert passed == [], [(d["run_at"], d["started_at"]) for d in passed[:5]]
    # And the stream was still there when it started: aging, not an idle moment, let it in.
    waiting = [d for d in stream_jobs if d["run_at"] < low["started_at"] and (
        d.get("started_at") is None or d["started_at"] > low["started_at"]
    )]
    assert len(waiting) > 20


async def test_without_aging_the_stream_goes_first(cluster: Cluster, store: JobStore) -> None:
    low, stream_jobs = await starved_job(cluster, store)
    if low["started_at"] is None:
        # Starved while the stream lasted: priority-10 jobs submitted after it kept passing it.
        passed = [
            d for d in stream_jobs if d["run_at"] > low["run_at"] and d.get("started_at")
        ]
        assert len(passed) > 100
    else:
        # It started only once every priority-10 job due before that had started.
        before = [d for d in stream_jobs if d["run_at"] <= low["started_at"]]
        assert all(d.get("started_at") is not None for d in before)
