"""Schedule overlap on real dispatchers: a 3 s task every second with `overlap="skip"`
never overlaps itself in the server's history, and each tick is exactly one decision
across the dispatchers (a job, or one `schedule.skipped` line); with `buffer_one`, one run
at most waits for the running one; with `cancel_other`, each tick cancels the run before
it, and the new run starts once that one has ended."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx

from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster

OVERLAPPING = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.overlapping"}
T = TypeVar("T")


async def poll(check: Callable[[], Awaitable[T | None]], timeout: float = 40) -> T:
    deadline = time.monotonic() + timeout
    while (got := await check()) is None:
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.3)
    return got


def iso(at: datetime) -> str:
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).isoformat()


async def test_skip_and_buffer_one_never_overlap_and_cancel_other_replaces_the_previous_run(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(**OVERLAPPING)
    disps = [cluster.dispatcher(**OVERLAPPING) for _ in range(2)]
    listed = {s["name"]: s for s in http.get("/schedules").json()["schedules"]}
    assert listed["slow-skip"]["overlap"] == "skip"
    assert listed["slow-replace"]["overlap"] == "cancel_other"
    out = cluster.cli("schedules")
    assert "overlap=skip" in out.stdout and "overlap=cancel_other" in out.stdout

    async def runs(name: str, status: str, n: int) -> list[dict[str, Any]] | None:
        docs = await store.jobs.find({"schedule.name": name}).to_list()
        docs.sort(key=lambda d: d["schedule"]["tick"])
        return docs if sum(d["status"] == status for d in docs) >= n else None

    # skip: two runs of the 3 s task completed, and the ticks between them made no job.
    skip_runs = await poll(lambda: runs("slow-skip", "completed", 2))
    spans = sorted((r["started_at"], r["finished_at"]) for r in skip_runs if r["finished_at"])
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, f"runs overlapped: {spans}"
    assert sum(r["status"] != "completed" for r in skip_runs) <= 1
    skipped = [e for d in disps for e in d.events("schedule.skipped")]
    per_tick = Counter(e["tick"] for e in skipped if e["schedule"] == "slow-skip")
    assert len(per_tick) >= 2 and set(per_tick.values()) == {1}, per_tick  # once per tick
    assert not set(per_tick) & {iso(r["schedule"]["tick"]) for r in skip_runs}  # not both

    # buffer_one: each run after the first waited for the one before it (at most one
    # waiting at a time: the ticks in between were skipped), and none overlapped.
    chained = await poll(lambda: runs("slow-buffer", "completed", 2))
    assert not chained[0].get("depends_on")
    for before, after in itertools.pairwise(chained):
        assert after["depends_on"] == [before["_id"]] and after["run_on_parent_failure"]
        if after["started_at"] is not None:
            assert after["started_at"] >= before["finished_at"]
    assert sum(r["status"] == "waiting" for r in chained) <= 1
    skipped = [e for d in disps for e in d.events("schedule.skipped")]
    assert any(e["schedule"] == "slow-buffer" for e in skipped)

    # cancel_other: every run but the newest was cancelled, and each run started only once
    # the one before it had ended.
    chain = await poll(lambda: runs("slow-replace", "cancelled", 2))
    for before, after in itertools.pairwise(chain):
        assert after["depends_on"] == [before["_id"]] and after["run_on_parent_failure"]
        assert before["status"] == "cancelled", (before, after)
        if after["started_at"] is not None:
            assert after["started_at"] >= before["finished_at"]
    stops = [e for d in disps for e in d.events("job.cancel_requested") if e.get("via")]
    assert {e["job_id"] for e in stops} >= {r["_id"] for r in chain[:2]}
    assert {e["via"] for e in stops} == {"schedule"}
