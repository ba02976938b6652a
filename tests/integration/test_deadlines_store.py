"""Deadlines in the store, on the real replica set: what a submit stores (a time as it is
given, a relative bound counted from the submit on the server's clock) from the Python
client and a batch, what a claim keeps of an earlier start (`first_started_at`), the
timer's look for passed bounds (its own or its task's default) and its fenced ends, and a
holder's end of a job it holds past a bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from brook import AsyncClient, InvalidInput, LeaseLost
from brook.common.domain.deadlines import TaskDeadlines
from brook.common.domain.models import JobSpec, whole_ms
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore, Lease, RunTimes, Tagged

OWNER = "d1"
LATER = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)


@pytest.fixture
async def client(settings: Settings, store: JobStore) -> AsyncIterator[AsyncClient]:
    await store.ensure_indexes()
    async with AsyncClient(settings.mongo_uri, settings.db) as c:
        yield c


async def test_a_submit_stores_its_bounds_as_times_counted_from_the_submit(
    client: AsyncClient, store: JobStore
) -> None:
    job = await client.submit("noop", start_within_s=30, deadline=LATER)
    stored = await store.get(job.id)
    assert stored.start_by == stored.created_at + timedelta(seconds=30)
    assert stored.deadline == LATER
    assert job.to_api()["start_by"] == stored.start_by
    [a, b] = await client.submit_many(
        [{"task": "noop", "deadline_s": timedelta(minutes=1)}, {"task": "noop"}]
    )
    got = await store.get(a.id)
    assert got.deadline == got.created_at + timedelta(minutes=1)
    assert (await store.get(b.id)).to_api()["deadline"] is None


async def test_a_run_at_later_than_start_by_stores_nothing(
    client: AsyncClient, store: JobStore
) -> None:
    with pytest.raises(InvalidInput, match="run_at is later than start_by"):
        await client.submit("noop", run_at=LATER + timedelta(seconds=1), start_by=LATER)
    assert await store.jobs.count_documents({}) == 0


async def test_a_claim_keeps_the_first_start_of_the_job(
    client: AsyncClient, store: JobStore
) -> None:
    job = await client.submit("noop", start_within_s=600)
    before = datetime.now(UTC) + timedelta(minutes=1)
    [first] = (await store.claim(OWNER, 30, Tagged(ids=[job.id], tag="a", before=before))).jobs
    assert first.first_started_at is None
    now = datetime.now(UTC)
    ran = RunTimes(started_at=now, finished_at=now)
    lease = Lease(job_id=job.id, attempt=first.attempts)
    await store.fail_attempt(lease, OWNER, {"type": "E", "message": "x"}, 0.0, ran=ran)
    [second] = (await store.claim(OWNER, 30, Tagged(ids=[job.id], tag="b", before=before))).jobs
    stored = await store.get(job.id)
    assert stored.first_started_at is not None and stored.started_at is None
    assert second.first_started_at is not None


BY_TASK = {"slow": TaskDeadlines(start_within_s=1, deadline_s=3600)}


async def test_the_timer_finds_each_passed_bound_once_and_ends_it_on_the_server_clock(
    client: AsyncClient, store: JobStore
) -> None:
    past = whole_ms(datetime.now(UTC) - timedelta(seconds=5))
    late = await client.submit("noop", start_by=past)
    due = await client.submit("noop", deadline=past, start_by=past)  # its deadline wins
    parent = await client.submit("noop", run_at=LATER)
    waiting = await client.submit("noop", depends_on=[parent.id], deadline=past)
    defaulted = await store.submit(JobSpec(task="slow", payload={}))
    ahead = await client.submit("noop", deadline=LATER, start_within_s=3600)
    await asyncio.sleep(1.1)  # `slow`'s default start_by (1 s after its submit) passes
    now = datetime.now(UTC)
    found = dict(await store.past_bounds(BY_TASK, now))
    assert found == {
        late.id: "start_by_passed",
        due.id: "deadline_exceeded",
        waiting.id: "deadline_exceeded",
        defaulted.job.id: "start_by_passed",
    }
    assert await store.next_bound(BY_TASK) == past  # the earliest, passed ones included
    assert await store.end_past_bound(ahead.id, "deadline_exceeded", BY_TASK) is None
    for job_id, bound in found.items():
        ended = await store.end_past_bound(job_id, bound, BY_TASK)
        assert ended is not None
        kind = "StartByPassed" if bound == "start_by_passed" else "DeadlineExceeded"
        assert ended.error is not None and ended.error["type"] == kind, ended
        assert ended.status == ("cancelled" if bound == "start_by_passed" else "failed")
        assert ended.finished_at is not None and ended.expire_at is not None
    stamped = await store.get(defaulted.job.id)
    assert stamped.start_by == stamped.created_at + timedelta(seconds=1)  # the default shows
    assert await store.past_bounds(BY_TASK, datetime.now(UTC)) == []
    assert await store.next_bound(BY_TASK) == (await store.get(ahead.id)).start_by


async def test_a_job_that_started_once_is_past_start_by_only_for_its_deadline(
    client: AsyncClient, store: JobStore
) -> None:
    job = await client.submit("noop", start_within_s=1, max_attempts=2)
    before = datetime.now(UTC) + timedelta(minutes=1)
    [claimed] = (await store.claim(OWNER, 30, Tagged(ids=[job.id], tag="a", before=before))).jobs
    now = datetime.now(UTC)
    ran = RunTimes(started_at=now, finished_at=now)
    lease = Lease(job_id=job.id, attempt=claimed.attempts)
    retried = await store.fail_attempt(lease, OWNER, {"type": "E", "message": "x"}, 60.0, ran=ran)
    assert retried.status == "pending"
    await asyncio.sleep(1.1)
    assert await store.past_bounds({}, datetime.now(UTC)) == []
    assert await store.end_past_bound(job.id, "start_by_passed", {}) is None


async def test_a_holder_ends_the_jobs_it_holds_past_a_bound_fenced(
    client: AsyncClient, store: JobStore
) -> None:
    past = whole_ms(datetime.now(UTC) - timedelta(seconds=1))
    a = await client.submit("noop", start_by=past)
    b = await client.submit("noop", max_attempts=5)
    before = datetime.now(UTC) + timedelta(minutes=1)
    got = (await store.claim(OWNER, 30, Tagged(ids=[a.id, b.id], tag="t", before=before))).jobs
    leases = {j.id: Lease(job_id=j.id, attempt=j.attempts) for j in got}
    with pytest.raises(LeaseLost):
        await store.end_held_past_bound(leases[a.id], "other", "start_by_passed", past)
    dropped = await store.end_held_past_bound(leases[a.id], OWNER, "start_by_passed", past)
    assert (dropped.status, dropped.error["type"] if dropped.error else None) == (
        "cancelled",
        "StartByPassed",
    )
    assert dropped.owner is None and dropped.history[-1]["error"] == "StartByPassed"
    stopped = await store.end_held_past_bound(leases[b.id], OWNER, "deadline_exceeded", past)
    assert stopped.status == "failed" and stopped.attempts == 1  # never retried
    assert stopped.error == {
        "type": "DeadlineExceeded",
        "message": f"its deadline passed, {past.isoformat(timespec='milliseconds')[:-6]}Z",
    }
    assert stopped.deadline == past


async def test_a_job_written_by_hand_with_no_date_of_submit_is_no_bound(store: JobStore) -> None:
    await store.ensure_indexes()
    odd = {"_id": "odd", "task": "slow", "status": "pending", "run_at": datetime.now(UTC)}
    await store.jobs.insert_one({**odd, "created_at": "yesterday"})
    assert await store.next_bound(BY_TASK) is None
    assert await store.past_bounds(BY_TASK, datetime.now(UTC)) == []
