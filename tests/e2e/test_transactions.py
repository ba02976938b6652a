"""Transactions end to end, on real processes and the real replica set: jobs enqueued in
the application's transaction run only if it commits; a transactional task's writes commit
with its completion exactly once, whatever happens to its attempts (frozen past the lease,
SIGKILLed before the commit, a step-down during the commit). Each test ends with the
history checker, effect rows included."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import PyMongoError

from brook import Client
from brook.common.domain.models import Doc
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster
from tests.e2e.test_faults import all_logs, submit, wait_all_terminal, worker_pid
from tests.support.checker import check_history, settled_logs
from tests.support.failpoints import hold_commands, wait_until_hit
from tests.support.procs import BrookProcess, pid_alive, wait_until


async def assert_clean(store: JobStore, ids: list[str], *procs: BrookProcess) -> None:
    logs = await settled_logs(store, lambda: all_logs(*procs))
    report = await check_history(store, ids, logs, rows="orders")
    assert report.problems == []


async def rows_of(store: JobStore, job_id: str) -> list[int]:
    return [r["attempt"] for r in await store.db["orders"].find({"job_id": job_id}).to_list()]


async def follow_ups(store: JobStore, job_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = await store.jobs.find({"payload.after": job_id}).to_list()
    return found


# -- enqueue in the application's transaction --------------------------------------------------


async def test_jobs_enqueued_in_committed_transactions_run_and_aborted_ones_never_exist(
    cluster: Cluster, store: JobStore, settings: Settings
) -> None:
    disp = cluster.dispatcher()
    app: AsyncMongoClient[Doc] = AsyncMongoClient(settings.mongo_uri)
    orders = await app[settings.db].create_collection("orders_placed")
    from brook import AsyncClient

    brook = AsyncClient(mongo_client=app, db=settings.db)

    async def place(n: int) -> tuple[str, bool]:
        async with app.start_session() as s:
            await s.start_transaction()
            await orders.insert_one({"n": n}, session=s)
            job = await brook.submit("echo", {"n": n}, session=s)
            commit = n % 2 == 0
            await (s.commit_transaction() if commit else s.abort_transaction())
            return job.id, commit

    try:
        placed = await asyncio.gather(*[place(n) for n in range(100)])
    finally:
        await app.close()
    committed = sorted(job_id for job_id, ok in placed if ok)
    aborted = {job_id for job_id, ok in placed if not ok}
    await wait_all_terminal(store, 50, timeout=60)
    jobs = await store.jobs.find({}).to_list()
    assert sorted(d["_id"] for d in jobs) == committed
    assert all(d["status"] == "completed" and d["result"]["n"] % 2 == 0 for d in jobs)
    assert not [e for e in disp.logs() if e.get("job_id") in aborted]
    await assert_clean(store, committed, disp)


def test_the_blocking_client_enqueues_in_a_transaction_and_the_job_runs_once_committed(
    cluster: Cluster, settings: Settings
) -> None:
    disp = cluster.dispatcher()
    app: MongoClient[Doc] = MongoClient(settings.mongo_uri)
    with app, Client(mongo_client=app, db=settings.db) as brook, app.start_session() as s:
        with s.start_transaction():
            app[settings.db]["orders_placed"].insert_one({"_id": "o1"}, session=s)
            job = brook.submit("echo", {"order": "o1"}, session=s)
            time.sleep(1.0)  # the dispatcher hears nothing until the commit
            assert not disp.events("job.claimed")
        done = brook.wait(job.id, timeout=30)
    assert done.status == "completed" and done.result == {"order": "o1"}
    assert [e["job_id"] for e in disp.events("job.claimed")] == [job.id]


# -- complete in the task's transaction --------------------------------------------------------


async def test_a_transactional_task_commits_its_row_and_follow_up_with_its_completion(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher()
    await store.db.create_collection("orders")
    ids = await submit(store, "order") + await submit(store, "order_sync")
    [failing] = await submit(store, "order_then_fail", max_attempts=1)
    await wait_all_terminal(store, 5, timeout=60)  # and the two follow-ups
    # A log line follows its acknowledged write: the last ones are waited for.
    wait_until(lambda: {e["job_id"] for e in disp.events("job.completed")} >= set(ids), 10)
    for job_id in ids:
        job = await store.get(job_id)
        assert job.status == "completed" and job.result == {"attempt": 1}, job.history
        assert await rows_of(store, job_id) == [1]
        [completed] = [h for h in job.history if h["status"] == "completed"]
        assert completed.get("transaction") is True  # written by the task's own transaction
        assert job.progress is not None and job.progress["fraction"] == 0.5  # folded in
        [follow] = await follow_ups(store, job_id)
        assert follow["status"] == "completed"
        [line] = [e for e in disp.events("job.completed") if e["job_id"] == job_id]
        assert line.get("transaction") is True
    failed = await store.get(failing)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error["message"] == "failed after writing"
    assert await store.db["orders"].count_documents({"job_id": failing}) == 0
    submitted = {e["job_id"] for e in disp.events("job.submitted")}
    assert submitted == {d["_id"] for d in await store.jobs.find({"task": "noop"}).to_list()}
    assert not disp.events("progress.discarded")
    await assert_clean(store, [*ids, failing], disp)


async def test_a_zombie_attempt_frozen_past_its_lease_leaves_exactly_one_row(
    cluster: Cluster, store: JobStore
) -> None:
    # One row per job, enforced: a zombie's transaction left open would block the next
    # attempt's insert until MongoDB's lifetime limit (60 s), unless it is ended.
    await store.db["orders"].create_index("job_id", unique=True)
    a = cluster.dispatcher()
    [job_id] = await submit(store, "order", payload={"hold_on": [1], "hold": 6})
    pid = worker_pid(a, job_id)
    a.wait_for_event("order.written", where=lambda e: e.get("job_id") == job_id)
    os.killpg(a.pid, signal.SIGSTOP)  # the dispatcher and its worker: frozen mid-transaction
    try:
        b = cluster.dispatcher()
        b.wait_for_event("lease.expired", timeout=30, where=lambda e: e["job_id"] == job_id)
        await wait_all_terminal(store, 2, timeout=30)  # attempt 2 and its follow-up
        assert b.events("transaction.ended")  # the zombie's transaction, ended at requeue
        os.kill(pid, signal.SIGCONT)  # the worker first: it tries to commit, unaware
        a.wait_for_event(
            "task.finished", timeout=20, where=lambda e: e.get("pid") == pid and "transaction" in e
        )
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    job = await store.get(job_id)
    assert job.status == "completed" and job.attempts == 2 and job.result == {"attempt": 2}
    assert await rows_of(store, job_id) == [2]
    assert [f["status"] for f in await follow_ups(store, job_id)] == ["completed"]
    a.wait_for_event("job.result_discarded", timeout=20, where=lambda e: e["job_id"] == job_id)
    assert not [e for e in a.events("job.completed") if e.get("job_id") == job_id]
    await asyncio.sleep(1.0)
    assert await rows_of(store, job_id) == [2]
    await assert_clean(store, [job_id], a, b)


async def test_a_worker_sigkilled_before_its_commit_leaves_no_row(
    cluster: Cluster, store: JobStore
) -> None:
    await store.db["orders"].create_index("job_id", unique=True)
    disp = cluster.dispatcher()
    [job_id] = await submit(store, "order_sync", payload={"hold_on": [1], "hold": 60})
    pid = worker_pid(disp, job_id)
    disp.wait_for_event("order.written", where=lambda e: e.get("job_id") == job_id)
    os.kill(pid, signal.SIGKILL)
    disp.wait_for_event("transaction.ended", timeout=10, where=lambda e: e["job_id"] == job_id)
    started = time.monotonic()
    await wait_all_terminal(store, 2, timeout=30)  # attempt 2, not held, and its follow-up
    assert time.monotonic() - started < 15  # not held up by the dead worker's transaction
    job = await store.get(job_id)
    assert job.status == "completed" and job.attempts == 2
    assert [h.get("error") for h in job.history if h["status"] == "pending"][1:] == [
        "WorkerCrashed"
    ]
    assert await rows_of(store, job_id) == [2]
    assert len(await follow_ups(store, job_id)) == 1
    assert not pid_alive(pid)
    await assert_clean(store, [job_id], disp)


async def test_a_step_down_during_the_commit_leaves_the_completion_and_the_row_or_neither(
    cluster: Cluster, store: JobStore, mongo: Any
) -> None:
    rs = mongo.replset
    assert rs is not None, "needs the embedded replica set"
    disp = cluster.dispatcher(BROOK_CONCURRENCY="1")  # one worker: the app name is known
    worker = int(disp.wait_for_event("worker.started", timeout=30)["pid"])
    old = rs.primary_index()
    direct: MongoClient[Doc] = MongoClient(f"mongodb://127.0.0.1:{rs.ports[old]}/?directConnection=true")
    # The worker's first commit waits 3 s on the primary before it runs: step it down
    # meanwhile, once the server says the commit is in that wait.
    count = hold_commands(
        direct, f"brook-worker:{worker}", ["commitTransaction"], block_ms=3000, mode={"times": 1}
    )
    try:
        [job_id] = await submit(store, "order", max_attempts=5)
        wait_until_hit(direct, count, timeout=30)
        with contextlib.suppress(PyMongoError):  # the stepping-down primary hangs up
            direct.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
    finally:
        with contextlib.suppress(PyMongoError):
            direct.admin.command("configureFailPoint", "failCommand", mode="off")
        direct.close()
    wait_until(lambda: rs.primary_index() not in (None, old), timeout=60, interval=0.2)
    await wait_all_terminal(store, 2, timeout=90)
    job = await store.get(job_id)
    assert job.status == "completed"
    # Each attempt: its completion and its row together, or neither.
    assert await rows_of(store, job_id) == [job.attempts]
    assert len(await follow_ups(store, job_id)) == 1
    await assert_clean(store, [job_id], disp)
