"""A task's completion committed in its own transaction, against the real replica set: the
protocol of `brook.common.store.transactions` (fenced, committed with the task's writes, aborted on a
lost lease), the writes that must pass an open transaction by (heartbeats, progress), and
commits whose outcome is unknown, decided by the dispatcher from what committed. Faults
come from the server (`configureFailPoint`), aimed at this test's client by its app name."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from structlog.testing import capture_logs

from brook.common.domain.models import Doc, Job, JobSpec
from brook.common.protocol.runner import Outcome
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import spawn_logged
from brook.common.store.db import database, make_client
from brook.common.store.jobs import JobStore, Lease
from brook.common.store.transactions import (
    TASK_TRANSACTION,
    TxEnd,
    begin_transaction,
    complete_in_transaction,
    task_ops,
)
from brook.dispatcher.attempts.dependents import Dependents
from brook.dispatcher.attempts.outcomes import Outcomes
from tests.support.failpoints import fail_commands, fail_nothing

OWNER = "test-owner"
APP = "tx-test"


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[AsyncMongoClient[Doc]]:
    """The worker process's client, as `make_client` builds it (its app name is aimed at)."""
    client = make_client(settings, appname=APP)
    yield client
    await fail_nothing(client)
    await client.close()


async def fail_commits(client: AsyncMongoClient[Doc], mode: Any, **data: Any) -> None:
    await fail_commands(client, APP, ["commitTransaction"], mode, **data)


async def claimed(store: JobStore) -> Lease:
    await store.submit(JobSpec(task="order", payload={}))
    job = (await store.claim(OWNER, 30)).job
    assert job is not None
    return Lease(job_id=job.id, attempt=job.attempts)


async def attempt(
    worker: AsyncMongoClient[Doc],
    settings: Settings,
    store: JobStore,
    lease: Lease,
    *,
    meanwhile: Any = None,
    until_s: float = 5.0,
) -> tuple[TxEnd, dict[str, Any]]:
    """One transactional attempt: mark the job, open the transaction, write this attempt's
    row, let `meanwhile` happen, then complete. Returns the end and the session id."""
    session = worker.start_session()
    ops = task_ops(session, settings)
    assert await begin_transaction(ops, lease, OWNER, session.session_id, 30)
    await session.start_transaction(**TASK_TRANSACTION)
    row = {"job_id": lease.job_id, "attempt": lease.attempt}
    await database(worker, settings)["orders"].insert_one(row, session=session)
    if meanwhile is not None:
        await meanwhile()
    progress = {"fraction": 1.0, "message": "done", "attempt": lease.attempt}
    end = await complete_in_transaction(
        ops,
        lease,
        OWNER,
        {"ok": True},
        retention_s=settings.retention_seconds,
        progress=progress,
        until=time.monotonic() + until_s,
    )
    lsid = dict(session.session_id)
    await ops.end()
    return end, lsid


async def rows(store: JobStore, lease: Lease) -> list[int]:
    return [r["attempt"] for r in await store.db["orders"].find({"job_id": lease.job_id}).to_list()]


async def test_the_completion_commits_with_the_tasks_writes_while_heartbeats_pass_it_by(
    worker: AsyncMongoClient[Doc], settings: Settings, store: JobStore
) -> None:
    await store.db.create_collection("orders")
    lease = await claimed(store)

    async def heartbeat_and_progress() -> None:
        # Writes to the job now would make the completion a write conflict: they must pass
        # it by, and the lease must not count as lost.
        assert await store.renew(OWNER, [lease], 30) == set()
        written = await store.set_progress_many(OWNER, [(lease, 0.5, "half")])
        assert written == {lease.job_id}

    end, _ = await attempt(worker, settings, store, lease, meanwhile=heartbeat_and_progress)
    assert end.kind == "committed"
    job = await store.get(lease.job_id)
    assert job.status == "completed" and job.result == {"ok": True} and job.owner is None
    assert job.progress is not None and job.progress["message"] == "done"
    assert job.history[-1]["transaction"] is True
    doc = await store.jobs.find_one({"_id": lease.job_id})
    assert doc is not None and "tx" not in doc
    assert await rows(store, lease) == [1]
    assert await store.completed_by(lease) and await store.renew(OWNER, [lease], 30) == set()


async def test_a_lease_lost_before_the_commit_aborts_the_transaction_and_its_writes_vanish(
    worker: AsyncMongoClient[Doc], settings: Settings, store: JobStore
) -> None:
    await store.db.create_collection("orders")
    lease = await claimed(store)

    async def lose_the_lease() -> None:  # what a watchdog does to a frozen holder
        await store.fail_attempt(lease, OWNER, {"type": "LeaseExpired"}, 0)
        assert (await store.claim("other-owner", 30)).job is not None

    end, _ = await attempt(worker, settings, store, lease, meanwhile=lose_the_lease)
    # The fence either matched nothing or met the newer write (a conflict): aborted both ways.
    assert end.kind in ("lost", "aborted")
    job = await store.get(lease.job_id)
    assert job.status == "running" and job.attempts == 2 and job.owner == "other-owner"
    assert await rows(store, lease) == []


async def test_a_lease_lost_before_the_transaction_began_is_refused_at_once(
    worker: AsyncMongoClient[Doc], settings: Settings, store: JobStore
) -> None:
    lease = await claimed(store)
    await store.fail_attempt(lease, OWNER, {"type": "LeaseExpired"}, 0)
    session = worker.start_session()
    assert not await begin_transaction(task_ops(session, settings), lease, OWNER, {}, 30)
    await session.end_session()


async def test_a_commit_retried_after_a_lost_reply_commits_once(
    worker: AsyncMongoClient[Doc], settings: Settings, store: JobStore
) -> None:
    await store.db.create_collection("orders")
    lease = await claimed(store)
    await fail_commits(worker, {"times": 1}, closeConnection=True)
    end, _ = await attempt(worker, settings, store, lease)
    assert end.kind == "committed"
    assert (await store.get(lease.job_id)).status == "completed"
    assert await rows(store, lease) == [1]


async def test_an_unknown_commit_that_committed_is_recorded_as_completed_by_reading_it(
    worker: AsyncMongoClient[Doc], settings: Settings, store: JobStore
) -> None:
    await store.db.create_collection("orders")
    lease = await claimed(store)
    # Every commit runs, then reports a write concern error: its outcome stays unknown.
    await fail_commits(
        worker, "alwaysOn", writeConcernError={"code": 64, "errmsg": "waiting for replication"}
    )
    end, lsid = await attempt(worker, settings, store, lease, until_s=1.0)
    assert end.kind == "unknown" and end.error is not None
    job = await store.get(lease.job_id)
    verdict = await record(settings, store, job, lease, end, lsid)
    assert verdict == "applied"
    assert (await store.get(lease.job_id)).status == "completed"
    assert await rows(store, lease) == [1]


async def test_an_unknown_commit_that_never_ran_fails_the_attempt_and_leaves_no_row(
    worker: AsyncMongoClient[Doc], settings: Settings, store: JobStore
) -> None:
    await store.db.create_collection("orders")
    lease = await claimed(store)
    await fail_commits(worker, "alwaysOn", closeConnection=True)
    end, lsid = await attempt(worker, settings, store, lease, until_s=1.0)
    assert end.kind == "unknown"
    await fail_commits(worker, "off")
    job = await store.get(lease.job_id)
    # The dispatcher ends the session (aborting the transaction), then its fenced write decides.
    verdict = await record(settings, store, job, lease, end, lsid)
    assert verdict == "applied"
    after = await store.get(lease.job_id)
    assert after.status == "pending" and after.error is not None
    assert after.error["type"] == "TransactionCommitUnknown"
    assert await rows(store, lease) == []


async def record(
    settings: Settings, store: JobStore, job: Job, lease: Lease, end: TxEnd, lsid: dict[str, Any]
) -> str:
    """What the dispatcher does with a worker's `unknown` (as `executor.pool` reports it)."""
    outcomes = Outcomes(
        settings, store, OWNER, spawn_logged, Dependents(settings, store, spawn_logged)
    )
    outcome = Outcome(kind="error", error=end.error, tx_session=lsid)
    with capture_logs() as logs:
        verdict = await outcomes.record(job, lease, outcome, 0.1)
    events = [e["event"] for e in logs]
    assert "transaction.ended" in events
    if verdict.kind == "applied" and (await store.get(lease.job_id)).status == "completed":
        assert [e.get("transaction") for e in logs if e["event"] == "job.completed"] == [True]
    return verdict.kind


async def test_a_failure_whose_reply_was_a_write_concern_error_is_recorded_not_discarded(
    settings: Settings, store: JobStore
) -> None:
    """The dispatcher's fenced failure write applies, but its reply is a write-concern
    error (as in a failover: applied, not known to be majority-committed). The next try
    finds the attempt no longer held: the job's history shows that this write ended it, so
    the verdict is the failure, not a lost lease."""
    lease = await claimed(store)
    job = await store.get(lease.job_id)
    client = make_client(settings, appname="outcomes-test")
    dispatcher_store = JobStore(database(client, settings))
    outcomes = Outcomes(
        settings, dispatcher_store, OWNER, spawn_logged, Dependents(settings, store, spawn_logged)
    )
    await fail_commands(
        client,
        "outcomes-test",
        ["findAndModify"],
        {"times": 1},
        writeConcernError={"code": 64, "errmsg": "waiting for replication timed out"},
    )
    try:
        outcome = Outcome(kind="error", error={"type": "Boom", "message": "x"}, retry_delay=0.0)
        with capture_logs() as logs:
            verdict = await outcomes.record(job, lease, outcome, 0.1)
    finally:
        await fail_nothing(client)
        await client.close()
    events = [e["event"] for e in logs]
    assert verdict.kind == "applied" and verdict.job is not None, (verdict, events)
    assert "job.result_discarded" not in events and "job.retry_scheduled" in events, events
    stored = await store.get(lease.job_id)
    assert stored.status == "pending" and stored.error == {"type": "Boom", "message": "x"}
    assert [h["status"] for h in stored.history].count("pending") == 2  # submitted, retried once
