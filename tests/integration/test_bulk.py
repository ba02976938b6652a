"""Bulk retry and cancel (`retry_many` / `cancel_many`, the code behind `POST /jobs/retry`
and `POST /jobs/cancel`) on the real replica set: each filter field, a dry run, a resend
that changes nothing more, pages larger than one write, and the indexes the filters use."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from brook import AsyncClient, InvalidInput
from brook.common.domain.bulk import PAGE
from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore, Lease, Tagged

OWNER = "d1"


async def failed(
    store: JobStore, n: int, *, error: str, task: str = "noop", queue: str = "default",
    key: str | None = None,
) -> list[str]:
    """`n` jobs that failed with `error` (their one attempt), through the store's own writes."""
    spec = JobSpec(task=task, payload={}, queue=queue, key=key, max_attempts=1)
    ids = [s.job.id for s in await store.submit_many([spec] * n)]
    jobs = (await store.claim(OWNER, 30, Tagged(ids=ids, tag="tag", before=datetime.now(UTC) + timedelta(minutes=1)))).jobs
    assert len(jobs) == n
    await asyncio.gather(
        *(
            store.fail_attempt(
                Lease(job_id=j.id, attempt=j.attempts), OWNER, {"type": error, "message": "x"}, 0
            )
            for j in jobs
        )
    )
    return ids


async def statuses(store: JobStore, ids: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for doc in await store.jobs.find({"_id": {"$in": ids}}, {"status": 1}).to_list():
        out[doc["status"]] = out.get(doc["status"], 0) + 1
    return out


@pytest.fixture
async def client(settings: Settings, store: JobStore) -> AsyncIterator[AsyncClient]:
    await store.ensure_indexes()
    async with AsyncClient(settings.mongo_uri, settings.db) as c:
        yield c


async def test_retry_by_error_type_counts_first_then_retries_and_a_resend_changes_nothing(
    store: JobStore, client: AsyncClient
) -> None:
    timeouts = await failed(store, 7, error="TimeoutError")
    others = await failed(store, 3, error="ValueError")
    assert await client.retry_many(error_type="TimeoutError", dry_run=True) == 7
    assert await statuses(store, timeouts) == {"failed": 7}  # a dry run changes nothing
    assert await client.retry_many(status="failed", error_type="TimeoutError") == 7
    assert await statuses(store, timeouts) == {"pending": 7}
    assert await statuses(store, others) == {"failed": 3}
    assert await client.retry_many(status="failed", error_type="TimeoutError") == 0  # resent
    job = await store.get(timeouts[0])
    assert job.max_attempts == 2 and job.history[-1]["reason"] == "retry"


async def test_each_filter_field_narrows_a_bulk_retry(
    store: JobStore, client: AsyncClient
) -> None:
    by_task = await failed(store, 2, error="E", task="echo")
    by_queue = await failed(store, 2, error="E", queue="mail")
    by_key = await failed(store, 2, error="E", key="acme")
    rest = await failed(store, 2, error="E")
    assert await client.retry_many(task="echo", dry_run=True) == 2
    assert await client.retry_many(queue="mail", dry_run=True) == 2
    assert await client.retry_many(key="acme", dry_run=True) == 2
    assert await client.retry_many(status=["failed", "cancelled"], dry_run=True) == 8
    # Time ranges: everything finished or created before now; nothing after.
    now = datetime.now(UTC)
    assert await client.retry_many(finished_until=now + timedelta(seconds=5), dry_run=True) == 8
    assert await client.retry_many(finished_since=now + timedelta(seconds=5), dry_run=True) == 0
    assert await client.retry_many(created_since=now - timedelta(minutes=5), dry_run=True) == 8
    assert await client.retry_many(created_until=now - timedelta(minutes=5), dry_run=True) == 0
    assert await client.retry_many(task="echo") == 2
    assert await client.retry_many(queue="mail") == 2
    assert await client.retry_many(key="acme") == 2
    assert await statuses(store, by_task + by_queue + by_key) == {"pending": 6}
    assert await statuses(store, rest) == {"failed": 2}
    # A status a retry cannot change is no match.
    assert await client.retry_many(status="completed") == 0


async def test_cancel_by_key_cancels_pending_jobs_asks_running_ones_and_resends_change_nothing(
    store: JobStore, client: AsyncClient
) -> None:
    specs = [JobSpec(task="noop", payload={}, key="acme")] * (PAGE + 20)
    ids = [s.job.id for s in await store.submit_many(specs)]
    other = (await store.submit(JobSpec(task="noop", payload={}, key="globex"))).job.id
    running = (await store.claim(OWNER, 30, Tagged(ids=ids[:2], tag="tag", before=datetime.now(UTC) + timedelta(minutes=1)))).jobs
    assert len(running) == 2
    assert await client.cancel_many(key="acme", dry_run=True) == PAGE + 20
    # More than a page: every job, in several writes.
    assert await client.cancel_many(key="acme") == PAGE + 20
    assert await statuses(store, ids) == {"cancelled": PAGE + 18, "running": 2}
    for job in running:  # its dispatcher stops it
        assert (await store.get(job.id)).cancel_requested
    assert await client.cancel_many(key="acme") == 0  # resent: nothing more
    assert await client.cancel_many(key="acme", dry_run=True) == 0
    assert (await store.get(other)).status == "pending"


async def test_a_bulk_filter_must_name_something_and_is_validated_like_the_api(
    client: AsyncClient,
) -> None:
    with pytest.raises(InvalidInput):
        await client.retry_many()
    with pytest.raises(InvalidInput):
        await client.cancel_many(status="nonsense")
    with pytest.raises(InvalidInput):
        await client.retry_many(queue="bad name!")


async def test_the_bulk_filters_read_indexes(store: JobStore) -> None:
    await store.ensure_indexes()
    from brook.common.domain.bulk import JobFilter
    from brook.common.domain.status import JobStatus
    from brook.common.store.queries import bulk_index, bulk_match

    plans = {}
    for label, f, action in (
        ("retry by error type since", JobFilter(error_type="E", finished_since=datetime.now(UTC)), "retry"),
        ("cancel by key", JobFilter(key="acme"), "cancel"),
        ("retry by task", JobFilter(task="echo", status=JobStatus.FAILED), "retry"),
    ):
        cursor = store.jobs.find(bulk_match(f, action))  # type: ignore[arg-type]
        hint = bulk_index(f, action)  # type: ignore[arg-type]
        explain = await (cursor.hint(hint) if hint else cursor).explain()
        plans[label] = str(explain["queryPlanner"]["winningPlan"])
    assert "failures" in plans["retry by error type since"]
    assert "by_key" in plans["cancel by key"]
    assert "IXSCAN" in plans["retry by task"]


async def test_a_bulk_call_takes_one_job_filter_or_its_fields_as_keywords(
    store: JobStore, client: AsyncClient
) -> None:
    from brook import JobFilter

    await failed(store, 4, error="TimeoutError", queue="mail")
    await failed(store, 2, error="ValueError", queue="mail")
    timeouts = JobFilter(queue="mail", error_type="TimeoutError")
    assert await client.retry_many(timeouts, dry_run=True) == 4
    assert await client.retry_many(queue="mail", error_type="TimeoutError", dry_run=True) == 4
    with pytest.raises(TypeError):
        await client.retry_many(timeouts, queue="mail")
    with pytest.raises(InvalidInput):
        await client.cancel_many(JobFilter())
    assert await client.retry_many(timeouts) == 4
    assert await client.cancel_many(JobFilter(queue="mail", status=["pending"])) == 4


async def test_a_job_a_bulk_retry_retried_that_fails_again_before_the_next_page_is_not_retried_twice(
    store: JobStore, client: AsyncClient
) -> None:
    ids = await failed(store, PAGE + 1, error="DiskFull")
    pages = client._store.matching_page
    calls = 0

    async def failing_again(*args: object, **kwargs: object) -> list[dict[str, object]]:
        # Before the second page is read, every job the first page retried has run again
        # and failed again (as a job that fails at once does): the filter names it again.
        nonlocal calls
        calls += 1
        if calls == 2:
            later = datetime.now(UTC) + timedelta(minutes=1)
            again = (await store.claim(OWNER, 30, Tagged(ids=ids, tag="again", before=later))).jobs
            assert len(again) == PAGE
            for j in again:
                lease = Lease(job_id=j.id, attempt=j.attempts)
                await store.fail_attempt(lease, OWNER, {"type": "DiskFull", "message": "x"}, 0)
        return await pages(*args, **kwargs)  # type: ignore[arg-type]

    client._store.matching_page = failing_again  # type: ignore[method-assign]
    assert await client.retry_many(status="failed", error_type="DiskFull") == PAGE + 1
    docs = await store.jobs.find({"_id": {"$in": ids}}, {"max_attempts": 1}).to_list()
    assert {d["max_attempts"] for d in docs} == {2}  # each retried once
