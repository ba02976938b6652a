"""The Python client and the store operations behind it, against the real replica set:
submit, batches, wait on a change stream, unique keys, retry, retention, routing."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brook import AsyncClient, Client, InvalidInput, JobConflict, JobNotFound, WaitTimeout
from brook.common.client.task_directory import TaskDirectory
from brook.common.domain.models import JobSpec
from brook.common.domain.status import ALLOWED, RETRIES, TRANSITIONS, JobStatus
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.fields import HISTORY_CAP
from brook.common.store.jobs import BestDue, JobStore, Lease
from brook.common.store.queries import CLAIM_SORT, claim_filter, claim_index
from tests.support.commands import CommandCounter

OWNER = "test-owner"


@pytest.fixture
async def listened(settings: Settings) -> AsyncIterator[tuple[AsyncClient, CommandCounter]]:
    counter = CommandCounter()
    client = AsyncClient._wrap(settings, make_client(settings, event_listeners=[counter]))
    yield client, counter
    await client.close()


@pytest.fixture
async def aclient(settings: Settings) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(settings.mongo_uri, settings.db) as client:
        yield client


def spec(task: str = "noop", **kw: Any) -> JobSpec:
    return JobSpec(task=task, payload=kw.pop("payload", {}), **kw)


async def run_once(store: JobStore, result: Any = None, **claim: Any) -> str:
    """Claim the next job and complete it, as a dispatcher would."""
    job = (await store.claim(OWNER, 30, BestDue(**claim))).job
    assert job is not None
    written = await store.complete_many(OWNER, [(Lease(job_id=job.id, attempt=job.attempts), result)])
    assert written.done == {job.id}
    return job.id


# -- submit, read, cancel, retry -------------------------------------------------------------


async def test_the_async_client_submits_reads_lists_cancels_and_retries(
    aclient: AsyncClient, store: JobStore
) -> None:
    job = await aclient.submit("echo", {"x": 1}, queue="emails", priority=3, delay=60)
    assert job.status == JobStatus.PENDING and job.queue == "emails" and job.priority == 3
    assert 59 < (job.run_at - job.created_at).total_seconds() < 61  # the server's clock
    assert (await aclient.get(job.id)).payload == {"x": 1}
    other = await aclient.submit("noop", delay=timedelta(minutes=1))
    assert [j.id for j in await aclient.list()] == [other.id, job.id]
    assert [j.id for j in await aclient.list(queue="emails")] == [job.id]
    assert [j.id for j in await aclient.list(task="noop", status="pending")] == [other.id]
    cancelled = await aclient.cancel(job.id)
    assert cancelled.status == JobStatus.CANCELLED and cancelled.expire_at is not None
    again = await aclient.retry(job.id)
    assert again.status == JobStatus.PENDING and again.expire_at is None
    assert again.max_attempts == 3 and [h["status"] for h in again.history] == [
        "pending",
        "cancelled",
        "pending",
    ]
    with pytest.raises(JobConflict, match="only failed or cancelled"):
        await aclient.retry(job.id)
    with pytest.raises(JobNotFound):
        await aclient.get("nope")
    with pytest.raises(JobNotFound):
        await aclient.retry("nope")


async def test_retry_renews_the_attempt_budget_and_attempts_keep_counting(
    aclient: AsyncClient, store: JobStore
) -> None:
    job = await aclient.submit("noop", max_attempts=2)
    for attempt in (1, 2):
        claimed = (await store.claim(OWNER, 30)).job
        assert claimed is not None and claimed.attempts == attempt
        await store.fail_attempt(Lease(job_id=job.id, attempt=attempt), OWNER, {"type": "E"}, 0)
    assert (await aclient.get(job.id)).status == JobStatus.FAILED
    retried = await aclient.retry(job.id)
    assert (retried.attempts, retried.max_attempts) == (2, 4)
    assert retried.error == {"type": "E"}  # the last error stays until the next outcome
    third = (await store.claim(OWNER, 30)).job
    assert third is not None and third.attempts == 3  # the fencing token is never reused
    stale = Lease(job_id=job.id, attempt=2)
    assert not (await store.complete_many(OWNER, [(stale, "stale")])).done


async def test_every_transition_including_retries_is_in_the_table(
    aclient: AsyncClient, store: JobStore
) -> None:
    failed = await aclient.submit("noop", max_attempts=1)
    claimed = (await store.claim(OWNER, 30)).job
    assert claimed is not None
    await store.fail_attempt(Lease(job_id=failed.id, attempt=1), OWNER, {"type": "E"}, 0)
    await aclient.retry(failed.id)
    cancelled = await aclient.submit("noop", delay=3600)
    await aclient.cancel(cancelled.id)
    await aclient.retry(cancelled.id)
    # a workflow job retried while a parent has not completed waits for it again ...
    _, child = await aclient.submit_many(
        [{"task": "noop", "ref": "p", "delay": 3600}, {"task": "noop", "depends_on": ["p"]}]
    )
    await aclient.cancel(child.id)
    assert (await aclient.retry(child.id)).status == JobStatus.WAITING
    # ... and one that runs on parent failure is released again at once
    gone = await aclient.cancel((await aclient.submit("noop", delay=3600)).id)
    tolerant = await aclient.submit(
        "echo", max_attempts=1, depends_on=[gone.id], run_on_parent_failure=True
    )
    claimed = (await store.claim(OWNER, 30, BestDue(tasks={"echo"}))).job
    assert claimed is not None and claimed.id == tolerant.id
    await store.fail_attempt(Lease(job_id=tolerant.id, attempt=1), OWNER, {"type": "E"}, 0)
    again = await aclient.retry(tolerant.id)
    assert [h["status"] for h in again.history][-3:] == ["failed", "waiting", "pending"]
    seen: set[tuple[JobStatus, JobStatus]] = set()
    async for doc in store.jobs.find({}):
        statuses = [JobStatus(h["status"]) for h in doc["history"]]
        seen |= set(itertools.pairwise(statuses))
    assert seen <= ALLOWED and seen >= RETRIES
    assert not any(src in {JobStatus.FAILED, JobStatus.CANCELLED} for src, _ in TRANSITIONS)


def test_the_blocking_client_offers_the_same_operations(settings: Settings) -> None:
    with Client(settings.mongo_uri, settings.db) as client:
        job = client.submit("noop", {"n": 1}, idempotency_key="sync-1")
        assert client.submit("noop", idempotency_key="sync-1").id == job.id
        assert client.get(job.id).payload == {"n": 1}
        assert [j.id for j in client.list(limit=5)] == [job.id]
        [a, b] = client.submit_many([{"task": "noop"}, {"task": "echo", "delay": timedelta(hours=1)}])
        assert a.status == b.status == JobStatus.PENDING and b.run_at > a.run_at
        assert client.cancel(job.id).status == JobStatus.CANCELLED
        assert client.wait(job.id, timeout=5).status == JobStatus.CANCELLED
        started = time.monotonic()
        with pytest.raises(WaitTimeout, match="still pending") as info:
            client.wait(a.id, timeout=0.5)
        assert isinstance(info.value, TimeoutError) and time.monotonic() - started < 5
        assert {q.name: q.counts["pending"] for q in client.queues()} == {"default": 2}
        with pytest.raises(InvalidInput) as bad:
            client.submit("noop", priority="high")  # type: ignore[arg-type]
        assert bad.value.detail == [
            {"loc": ["priority"], "msg": "Input should be a valid integer", "type": "int_type"}
        ]


# -- wait --------------------------------------------------------------------------------------


async def test_wait_follows_a_change_stream_and_never_polls(
    listened: tuple[AsyncClient, CommandCounter], store: JobStore
) -> None:
    client, counter = listened
    job = await client.submit("echo", {"x": 1})
    counter.reset()
    waiter = asyncio.create_task(client.wait(job.id, timeout=30))
    await asyncio.sleep(1.0)
    claimed = (await store.claim(OWNER, 30)).job
    assert claimed is not None
    for _ in range(5):  # lease renewals change the job but not its status: no wake-up
        await store.renew(OWNER, [Lease(job_id=job.id, attempt=1)], 30)
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    assert not waiter.done()
    await store.complete_many(OWNER, [(Lease(job_id=job.id, attempt=1), {"x": 1})])
    done = await waiter
    assert done.status == JobStatus.COMPLETED and done.result == {"x": 1}
    # One stream, and one read of the job per status change it saw (pending at the start,
    # running, completed) in 3 seconds: nothing is read on a timer.
    assert counter.of("aggregate") == 1
    assert counter.of("find") == 3
    assert sum(n for (name, _), n in counter.counts.items() if name == "getMore") <= 3


async def test_wait_sees_a_completion_that_lands_between_its_read_and_its_stream(
    aclient: AsyncClient, store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await aclient.submit("echo", {"x": 1})
    assert (await store.claim(OWNER, 30)).job is not None
    read = JobStore.job_doc_now

    async def read_then_complete(self: JobStore, job_id: str) -> Any:
        doc, at = await read(self, job_id)  # the job as it was: running
        await store.complete_many(OWNER, [(Lease(job_id=job_id, attempt=1), {"x": 1})])
        return doc, at  # the stream opens after the completion

    monkeypatch.setattr(JobStore, "job_doc_now", read_then_complete)
    done = await aclient.wait(job.id, timeout=10)
    assert done.status == JobStatus.COMPLETED and done.result == {"x": 1}


async def test_wait_returns_at_once_for_a_finished_job_and_fails_for_an_unknown_one(
    aclient: AsyncClient,
) -> None:
    job = await aclient.submit("noop", delay=3600)
    await aclient.cancel(job.id)
    assert (await aclient.wait(job.id, timeout=2)).status == JobStatus.CANCELLED
    with pytest.raises(JobNotFound):
        await aclient.wait("nope", timeout=2)


# -- batches -----------------------------------------------------------------------------------


async def test_a_batch_of_1000_is_stored_with_one_write_round_trip(
    listened: tuple[AsyncClient, CommandCounter], store: JobStore
) -> None:
    client, counter = listened
    await client.submit("noop")  # the client's first write also makes sure of the indexes
    counter.reset()
    specs = [{"task": "echo", "payload": {"i": i}, "priority": i % 7} for i in range(1000)]
    jobs = await client.submit_many(specs)
    assert [j.payload["i"] for j in jobs] == list(range(1000))  # in spec order
    assert len({j.id for j in jobs}) == 1000
    writes = {k: n for k, n in counter.counts.items() if k[0] in ("insert", "update", "delete")}
    assert writes == {("insert", "jobs"): 1} and counter.statements == [1000]
    assert await store.jobs.count_documents({}) == 1001


async def test_a_batch_honours_idempotency_keys_per_spec(aclient: AsyncClient) -> None:
    first = await aclient.submit("noop", idempotency_key="k-known")
    out = await aclient.submit_many(
        [
            {"task": "noop", "idempotency_key": "k-known"},
            {"task": "noop", "idempotency_key": "k-new"},
            {"task": "noop", "idempotency_key": "k-new"},
            {"task": "noop"},
        ]
    )
    assert out[0].id == first.id and out[1].id == out[2].id and out[3].id not in (first.id, out[1].id)


async def test_a_batch_with_one_bad_spec_names_its_index_and_stores_nothing(
    aclient: AsyncClient, store: JobStore
) -> None:
    with pytest.raises(InvalidInput) as info:
        await aclient.submit_many([{"task": "noop"}] * 5 + [{"task": "noop", "max_attempts": 0}])
    assert isinstance(info.value.detail, list)
    assert info.value.detail[0]["loc"] == ["jobs", 5, "max_attempts"]
    with pytest.raises(InvalidInput, match="at most 1000"):
        await aclient.submit_many([{"task": "noop"}] * 1001)
    assert await store.jobs.count_documents({}) == 0


# -- unique keys -------------------------------------------------------------------------------


async def test_unique_for_s_returns_the_job_within_its_window_and_a_new_one_after(
    aclient: AsyncClient, store: JobStore
) -> None:
    first = await aclient.submit("noop", idempotency_key="daily", unique_for_s=1.0)
    assert first.unique_until is not None
    same = await aclient.submit("noop", idempotency_key="daily", unique_for_s=1.0)
    assert same.id == first.id
    await asyncio.sleep(1.2)
    results = await asyncio.gather(
        *[aclient.submit("noop", idempotency_key="daily", unique_for_s=60) for _ in range(10)]
    )
    assert len({j.id for j in results}) == 1 and results[0].id != first.id  # one new job
    old = await store.jobs.find_one({"_id": first.id})
    assert old is not None and "idempotency_key" not in old and old["released_key"] == "daily"
    [again] = await aclient.submit_many([{"task": "noop", "idempotency_key": "daily"}])
    assert again.id == results[0].id  # its window (60 s) is still open


async def test_a_plain_idempotency_key_stays_reserved_while_its_job_exists(
    aclient: AsyncClient,
) -> None:
    first = await aclient.submit("noop", idempotency_key="forever")
    await asyncio.sleep(0.2)
    later = await aclient.submit("noop", idempotency_key="forever", unique_for_s=0.1)
    assert later.id == first.id  # the existing job has no window: the key is its own


# -- retention and history ---------------------------------------------------------------------


async def test_ttl_removes_finished_jobs_and_leaves_active_ones(
    aclient: AsyncClient, store: JobStore
) -> None:
    """The test replica set runs MongoDB's TTL monitor every second."""
    # A few seconds of retention: long enough to read them back before the monitor runs.
    done_id = (await aclient.submit("noop", retention_s=5)).id
    await run_once(store)
    cancelled = await aclient.submit("noop", retention_s=5, delay=3600)
    await aclient.cancel(cancelled.id)
    kept = await aclient.submit("noop", delay=3600)  # the default: a week
    await aclient.cancel(kept.id)
    running = await aclient.submit("noop", retention_s=0)
    assert ((await store.claim(OWNER, 30)).job) is not None
    pending = await aclient.submit("noop", retention_s=0, delay=3600)
    for job_id in (done_id, cancelled.id):
        doc = await store.jobs.find_one({"_id": job_id})
        assert doc is not None and doc["expire_at"] >= doc["finished_at"]

    async def gone() -> bool:
        return await store.jobs.count_documents({"_id": {"$in": [done_id, cancelled.id]}}) == 0

    deadline = time.monotonic() + 30
    while not await gone():
        assert time.monotonic() < deadline, "the TTL monitor did not delete finished jobs"
        await asyncio.sleep(0.5)
    left = {d["_id"]: d for d in await store.jobs.find({}).to_list()}
    assert set(left) == {kept.id, running.id, pending.id}
    assert "expire_at" not in left[running.id] and "expire_at" not in left[pending.id]
    week = left[kept.id]["expire_at"] - left[kept.id]["finished_at"]
    assert abs(week.total_seconds() - 7 * 86400) < 1


async def test_the_deployment_default_retention_applies_at_the_terminal_write(
    settings: Settings,
) -> None:
    client = make_client(settings)
    store = JobStore(database(client, settings), retention_s=5)
    try:
        await store.ensure_indexes()
        sub = await store.submit(spec(max_attempts=1))
        job = (await store.claim(OWNER, 30)).job
        assert job is not None
        failed = await store.fail_attempt(Lease(job_id=sub.job.id, attempt=1), OWNER, {"type": "E"}, 0)
        assert failed.status == JobStatus.FAILED and failed.expire_at and failed.finished_at
        assert abs((failed.expire_at - failed.finished_at).total_seconds() - 5) < 0.01
    finally:
        await client.drop_database(settings.db)
        await client.close()


async def test_history_keeps_its_first_and_latest_entries_and_counts_what_it_dropped(
    store: JobStore,
) -> None:
    sub = await store.submit(spec(max_attempts=1000))
    for attempt in range(1, 41):  # 1 + 80 entries
        job = (await store.claim(OWNER, 30)).job
        assert job is not None
        await store.fail_attempt(Lease(job_id=sub.job.id, attempt=attempt), OWNER, {"type": "E"}, 0)
    job = await store.get(sub.job.id)
    assert len(job.history) == HISTORY_CAP and job.history_truncated == 81 - HISTORY_CAP
    assert job.history[0] == {"status": "pending", "at": job.created_at, "attempt": 0}
    assert job.history[-1]["attempt"] == 40 and job.history[-2]["status"] == "running"


# -- routing -----------------------------------------------------------------------------------


async def test_claims_take_only_the_tasks_and_queue_asked_for(store: JobStore) -> None:
    ids = {}
    for task, queue in itertools.product(("a", "b"), ("q1", "q2")):
        ids[task, queue] = (await store.submit(spec(task, queue=queue))).job.id
    assert ((await store.claim(OWNER, 30, BestDue(tasks={"c"}))).job) is None
    job = (await store.claim(OWNER, 30, BestDue(tasks={"b"}, queue="q2"))).job
    assert job is not None and job.id == ids["b", "q2"]
    claimed = await store.claim(OWNER, 30, BestDue(n=10, tasks={"a"}))
    jobs, dry = claimed.jobs, claimed.dry
    assert {j.id for j in jobs} == {ids["a", "q1"], ids["a", "q2"]} and dry
    assert await store.next_due(tasks={"a"}) is None
    assert await store.next_due(tasks={"b"}, queues={"q1"}) is not None
    assert await store.next_due(tasks={"b"}, queues={"q2"}) is None


@pytest.mark.parametrize(
    ("tasks", "queue", "index"),
    [
        ({"noop", "echo", "t3"}, None, "claim_by_task"),
        ({"noop", "echo", "t3"}, "emails", "claim_by_queue"),
        ({f"t{i}" for i in range(250)}, "emails", "claim_order"),
        (None, None, "claim_order"),
    ],
)
async def test_a_routed_claim_is_an_index_scan_without_an_in_memory_sort(
    store: JobStore, tasks: set[str] | None, queue: str | None, index: str
) -> None:
    for i in range(60):
        await store.submit(spec(("noop", "echo", "other")[i % 3], queue=("default", "emails")[i % 2], priority=i % 3))
    plan = await store.db.command(
        "explain",
        {
            "findAndModify": "jobs",
            "query": claim_filter(tasks, queue),
            "sort": dict(CLAIM_SORT),
            "hint": claim_index(tasks, queue),
            "update": [{"$set": {"status": "running"}}],
            "new": True,
        },
        verbosity="queryPlanner",
    )
    text = str(plan["queryPlanner"]["winningPlan"])
    assert "IXSCAN" in text and "COLLSCAN" not in text and "'SORT'" not in text
    assert f"'{index}'" in text


async def test_a_claim_skips_a_backlog_of_tasks_it_does_not_run_without_reading_it(
    store: JobStore,
) -> None:
    await store.submit_many([spec("nobody", run_at=datetime(2000, 1, 1, tzinfo=UTC))] * 500)
    mine = (await store.submit(spec("noop"))).job.id
    stats = await store.db.command(
        "explain",
        {
            "find": "jobs",
            "filter": claim_filter({"noop", "echo"}, None),
            "sort": dict(CLAIM_SORT),
            "hint": claim_index({"noop", "echo"}, None),
            "limit": 1,
        },
        verbosity="executionStats",
    )
    assert stats["executionStats"]["totalKeysExamined"] <= 3
    job = (await store.claim(OWNER, 30, BestDue(tasks={"noop", "echo"}))).job
    assert job is not None and job.id == mine


async def test_counts_by_queue_come_from_one_aggregation(store: JobStore) -> None:
    await store.submit(spec(queue="emails"))
    await store.submit(spec(queue="emails"))
    await store.submit(spec())
    await run_once(store, queue="emails", tasks={"noop"})
    counts = await store.count_by_queue()
    assert list(counts) == ["default", "emails"]
    assert counts["emails"]["pending"] == 1 and counts["emails"]["completed"] == 1
    assert counts["default"] == {"waiting": 0, "pending": 1, "running": 0, "completed": 0, "failed": 0, "cancelled": 0}


# -- presence and the task-name check ----------------------------------------------------------


async def test_live_dispatchers_are_those_seen_within_a_few_leases(store: JobStore) -> None:
    await store.presence.announce("d1", name="one", tasks={"a", "b"}, queues=None, lease_seconds=30)
    await store.presence.announce("d2", name="two", tasks={"c"}, queues={"emails": 2}, lease_seconds=0.1)
    await asyncio.sleep(0.5)  # d2 missed 3 leases of 0.1 s
    live = await store.presence.live_dispatchers()
    assert [(d.owner, d.tasks, d.queues) for d in live] == [("d1", frozenset({"a", "b"}), None)]
    assert await store.presence.seen("d2")
    assert {d.owner for d in await store.presence.live_dispatchers()} == {"d1", "d2"}
    await store.presence.retire("d1")
    assert not await store.presence.seen("d1")


async def test_python_accepts_any_task_until_a_dispatcher_is_live_then_checks_its_tasks(
    store: JobStore,
) -> None:
    directory = TaskDirectory(store.presence, lambda: {"mine"}, open_while_none_live=True)
    assert await directory.unknown({"mine", "anything"}) == {}
    await store.presence.announce("d1", name="one", tasks={"remote"}, queues=None, lease_seconds=30)
    directory = TaskDirectory(store.presence, lambda: {"mine"}, open_while_none_live=True)
    assert await directory.unknown({"mine", "remote"}) == {}
    with pytest.raises(InvalidInput, match="unknown task 'nope'; known tasks: mine, remote"):
        await directory.check([spec("nope")], batch=False)
    api = TaskDirectory(store.presence, lambda: {"mine"}, open_while_none_live=False)
    await store.presence.retire("d1")
    assert set(await api.unknown({"remote"})) == {"remote"}  # the API never accepts blindly
