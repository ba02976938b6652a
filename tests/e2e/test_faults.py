"""Failure is normal: fault injection on real processes and a real replica set.

Each test ends with the history checker over the jobs collection and the JSON logs.
Leases are short (seconds) so the suite stays fast and deterministic on two cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from pymongo.errors import PyMongoError

from common.models import JobSpec
from common.settings import Settings
from common.store import JobStore
from tests.e2e.conftest import Cluster
from tests.support.checker import check_history
from tests.support.procs import BrookProcess, pid_alive, wait_until


async def count_terminal(store: JobStore) -> int:
    try:
        return await store.jobs.count_documents(
            {"status": {"$in": ["completed", "failed", "cancelled"]}}
        )
    except PyMongoError:
        return -1  # an election in progress; ask again


async def wait_all_terminal(store: JobStore, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while await count_terminal(store) < n:
        if time.monotonic() > deadline:
            cursor = await store.jobs.aggregate([{"$group": {"_id": "$status", "n": {"$sum": 1}}}])
            states = await cursor.to_list()
            raise AssertionError(f"not all {n} jobs terminal after {timeout}s: {states}")
        await asyncio.sleep(0.1)


async def submit(store: JobStore, task: str, n: int = 1, **kw: Any) -> list[str]:
    payload = kw.pop("payload", {})
    subs = await asyncio.gather(
        *[store.submit(JobSpec(task=task, payload=payload, **kw)) for _ in range(n)]
    )
    return [s.job.id for s in subs]


def all_logs(*procs: BrookProcess) -> list[dict[str, Any]]:
    return [e for p in procs for e in p.logs()]


def worker_pid(proc: BrookProcess, job_id: str, timeout: float = 15) -> int:
    event = proc.wait_for_event(
        "task.started", timeout=timeout, where=lambda e: e.get("job_id") == job_id
    )
    return int(event["pid"])


async def assert_clean(
    store: JobStore, ids: list[str], *procs: BrookProcess, effects: bool = False
) -> None:
    # A job's log line follows its write: a job seen terminal may not be logged yet. Lines
    # only ever get added, so waiting a little can fix a missing one, never hide an extra.
    deadline = time.monotonic() + 5
    while True:
        report = await check_history(store, ids, all_logs(*procs), effects=effects)
        if not report.problems or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert report.problems == []


# -- retries -----------------------------------------------------------------------------------


async def test_a_failing_task_is_retried_with_backoff_then_failed_with_its_traceback(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher()
    [job_id] = await submit(store, "fail", payload={"message": "boom"}, max_attempts=3)
    flaky = await submit(store, "flaky", payload={"succeed_on": 2})
    await wait_all_terminal(store, 2)
    job = await store.get(job_id)
    assert job.status == "failed" and job.attempts == 3
    assert (
        job.error is not None
        and job.error["type"] == "DemoFailure"
        and job.error["message"] == "boom"
    )
    assert "Traceback" in job.error["traceback"] and "raise DemoFailure" in job.error["traceback"]
    retries = [h for h in job.history if h["status"] == "pending"][1:]
    assert len(retries) == 2
    assert [e["event"] for e in disp.logs() if e.get("job_id") == job_id].count(
        "job.retry_scheduled"
    ) == 2
    ok = await store.get(flaky[0])
    assert ok.status == "completed" and ok.result == 2 and ok.attempts == 2
    await assert_clean(store, [job_id, *flaky], disp)


async def test_retry_with_a_delay_starts_promptly_when_due_without_polling(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(BROOK_SWEEP_SECONDS="30")  # the sweep cannot be what starts it
    [job_id] = await submit(store, "retry_once", payload={"delay": 1.0})
    await wait_all_terminal(store, 1, timeout=20)
    job = await store.get(job_id)
    assert job.status == "completed" and job.result == "second time lucky" and job.attempts == 2
    second_claim = [h for h in job.history if h["status"] == "running"][-1]["at"]
    lag = (second_claim - job.run_at).total_seconds()
    assert 0 <= lag < 0.5, lag  # the dispatcher's timer fired at run_at (target ~100 ms)
    await assert_clean(store, [job_id], disp)


# -- timeouts and crashes ----------------------------------------------------------------------


async def test_a_job_past_its_timeout_has_its_worker_killed_and_replaced(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher()
    [job_id] = await submit(store, "sleep", payload={"seconds": 30}, timeout_s=0.5, max_attempts=2)
    await wait_all_terminal(store, 1, timeout=30)
    job = await store.get(job_id)
    assert job.status == "failed" and job.attempts == 2
    assert job.error is not None and job.error["type"] == "Timeout"
    killed = disp.events("worker.killed")
    assert [k["reason"] for k in killed] == ["timeout", "timeout"]
    assert all(not pid_alive(k["pid"]) for k in killed)
    wait_until(lambda: len(disp.events("worker.started")) >= 4, timeout=10)  # 2 + 2 replacements
    [after] = await submit(store, "echo", payload={"still": "works"})
    await wait_all_terminal(store, 2)
    assert (await store.get(after)).result == {"still": "works"}
    await assert_clean(store, [job_id, after], disp)


async def test_a_crashed_or_killed_worker_fails_only_its_own_attempt(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher()
    [crash] = await submit(store, "crash", max_attempts=1)
    [victim] = await submit(store, "sleep", payload={"seconds": 30}, max_attempts=2)
    [bystander] = await submit(store, "sleep", payload={"seconds": 1.5})
    pid = worker_pid(disp, victim)
    worker_pid(disp, bystander)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    crashed = disp.wait_for_event("worker.crashed", where=lambda e: e.get("job_id") == victim)
    assert time.monotonic() - t0 < 1.0  # detected within a second
    assert crashed["signal"] == "SIGKILL"
    wait_until(lambda: disp.events("job.retry_scheduled"), timeout=5)
    await wait_until_status(store, bystander, "completed")
    by = await store.get(bystander)
    assert by.attempts == 1  # no other job was disturbed
    c = await store.get(crash)
    assert c.status == "failed" and c.error is not None and c.error["type"] == "WorkerCrashed"
    assert "exited with code 70" in c.error["message"]
    job = await store.get(victim)
    assert job.error is not None and job.error["type"] == "WorkerCrashed"
    assert "SIGKILL" in job.error["message"]
    await store.cancel(victim)
    await wait_all_terminal(store, 3, timeout=40)
    await assert_clean(store, [crash, victim, bystander], disp)


async def wait_until_status(store: JobStore, job_id: str, status: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (await store.get(job_id)).status != status:
        assert time.monotonic() < deadline, f"{job_id} never became {status}"
        await asyncio.sleep(0.05)


async def test_a_result_too_large_to_store_fails_the_attempt_with_a_clear_error(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher()
    [job_id] = await submit(store, "huge_result", max_attempts=1)
    await wait_all_terminal(store, 1)
    job = await store.get(job_id)
    assert job.status == "failed" and job.error is not None
    assert job.error["type"] == "ResultTooLarge" and "limit" in job.error["message"]
    await assert_clean(store, [job_id], disp)


# -- cancellation ------------------------------------------------------------------------------


async def test_cancelling_a_running_job_kills_its_worker_within_a_second(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(BROOK_SWEEP_SECONDS="30")  # the stream, not the sweep
    [job_id] = await submit(store, "sleep", payload={"seconds": 60})
    pid = worker_pid(disp, job_id)
    t0 = time.monotonic()
    requested = await store.cancel(job_id)
    assert requested.status == "running" and requested.cancel_requested
    await wait_until_status(store, job_id, "cancelled", timeout=5)
    assert time.monotonic() - t0 < 1.0
    assert not pid_alive(pid)
    killed = disp.events("worker.killed")
    assert killed and killed[0]["reason"] == "cancelled" and killed[0]["job_id"] == job_id
    await assert_clean(store, [job_id], disp)


# -- dispatchers that die, freeze or shut down -------------------------------------------------


async def test_a_sigkilled_dispatchers_jobs_are_requeued_and_run_exactly_once(
    cluster: Cluster, store: JobStore
) -> None:
    a = cluster.dispatcher()
    ids = await submit(store, "record", 6, payload={"seconds": 1.0})
    wait_until(lambda: len(a.events("task.started")) >= 2, timeout=15)
    workers = a.children()
    a.kill()  # SIGKILL: no release, no goodbye
    wait_until(lambda: not any(pid_alive(p) for p in workers), timeout=5)  # workers die with it
    b = cluster.dispatcher()
    await wait_all_terminal(store, 6, timeout=60)
    expired = b.events("lease.expired")
    assert len(expired) == 2 and {e["owner"] for e in expired} == {a_owner(a)}
    report = await check_history(store, ids, all_logs(a, b), effects=True)
    assert report.problems == []
    assert report.by_status() == {"completed": 6}


def a_owner(proc: BrookProcess) -> str:
    return str(proc.events("dispatcher.started")[0]["owner"])


async def test_a_frozen_dispatcher_loses_its_lease_and_kills_its_worker_on_waking(
    cluster: Cluster, store: JobStore
) -> None:
    a = cluster.dispatcher()
    [job_id] = await submit(store, "record", payload={"seconds": 8})
    pid = worker_pid(a, job_id)
    a.signal(signal.SIGSTOP)
    try:
        b = cluster.dispatcher()
        b.wait_for_event("lease.expired", timeout=20)
        b.wait_for_event("job.claimed", timeout=20, where=lambda e: e["job_id"] == job_id)
    finally:
        a.signal(signal.SIGCONT)
    lost = a.wait_for_event("lease.lost", timeout=10)
    assert lost["job_id"] == job_id
    killed = a.wait_for_event("worker.killed", timeout=5)
    assert killed["reason"] == "lease_lost" and killed["pid"] == pid
    wait_until(lambda: not pid_alive(pid), timeout=5)
    await wait_all_terminal(store, 1, timeout=30)
    job = await store.get(job_id)
    assert job.status == "completed" and job.attempts == 2 and job.result["attempt"] == 2
    assert not a.events("job.completed")
    await assert_clean(store, [job_id], a, b, effects=True)


async def test_sigterm_releases_running_jobs_so_another_dispatcher_takes_them_at_once(
    cluster: Cluster, store: JobStore
) -> None:
    cluster.settings = cluster.settings.model_copy(update={"lease_seconds": 60.0})
    a = cluster.dispatcher(BROOK_SHUTDOWN_GRACE_SECONDS="0.5")
    ids = await submit(store, "record", 2, payload={"seconds": 20})
    wait_until(lambda: len(a.events("task.started")) == 2, timeout=15)
    t0 = time.monotonic()
    assert a.stop() == 0
    released = a.events("job.released")
    assert sorted(e["job_id"] for e in released) == sorted(ids)
    for job_id in ids:
        job = await store.get(job_id)
        assert job.status == "pending" and job.attempts == 0 and job.owner is None
    b = cluster.dispatcher()
    wait_until(lambda: len(b.events("job.claimed")) == 2, timeout=10)
    assert time.monotonic() - t0 < 20  # long before the 60 s lease would have expired
    for job_id in ids:
        await store.cancel(job_id)
    await wait_all_terminal(store, 2, timeout=20)
    await assert_clean(store, ids, a, b, effects=True)


# -- failover ----------------------------------------------------------------------------------


async def test_failover_under_load_loses_no_acknowledged_job_and_completes_none_twice(
    cluster: Cluster, store: JobStore, settings: Settings, mongo: Any
) -> None:
    import threading

    import httpx

    rs = mongo.replset
    assert rs is not None, "needs the embedded replica set"
    cluster.api()
    disp = cluster.dispatcher()
    acknowledged: list[str] = []
    codes: list[int] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=cluster.api_url, timeout=30) as client:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    resp = client.post("/jobs", json={"task": "record", "payload": {"n": n}})
                except httpx.HTTPError:
                    codes.append(-1)
                    continue
                codes.append(resp.status_code)
                if resp.status_code == 202:
                    acknowledged.append(resp.json()["id"])
                elif resp.status_code == 503:
                    assert resp.headers.get("retry-after")
                    time.sleep(0.2)
                time.sleep(0.02)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(acknowledged) >= 20, timeout=30)
        old = rs.primary_index()
        direct = rs.ports[old]
        from pymongo import MongoClient

        c: MongoClient[dict[str, Any]] = MongoClient(
            f"mongodb://127.0.0.1:{direct}/?directConnection=true"
        )
        with contextlib.suppress(PyMongoError):  # the stepping-down primary hangs up
            c.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
        c.close()
        wait_until(lambda: rs.primary_index() not in (None, old), timeout=60, interval=0.2)
        new = rs.primary_index()
        assert new is not None
        wait_until(lambda: len(acknowledged) >= 40, timeout=60)
        rs.stop_member(new, signal.SIGKILL)
        t_kill = time.monotonic()
        wait_until(lambda: rs.primary_index() not in (None, new), timeout=60, interval=0.2)
        before = len(acknowledged)
        wait_until(lambda: len(acknowledged) > before + 10, timeout=60)
        recovered = time.monotonic() - t_kill
    finally:
        stop.set()
        thread.join(30)
        rs.up()
    assert recovered < 30, recovered
    assert 500 not in codes and -1 not in codes, sorted(set(codes))
    await wait_all_terminal(store, len(acknowledged), timeout=120)
    report = await check_history(store, acknowledged, disp.logs(), effects=True)
    assert report.problems == []


# -- history lost ------------------------------------------------------------------------------


async def test_a_dispatcher_whose_token_fell_off_the_oplog_sweeps_and_runs_everything(
    tmp_path: Any, db_name: str
) -> None:
    from brook.replset import ReplicaSet
    from common.db import database, make_client

    # A 1 MB oplog and a checkpoint every second, so the oplog really is truncated.
    rs = ReplicaSet(
        home=tmp_path / "tiny",
        base_port=27567,
        members=1,
        oplog_mb=1,
        extra_args=("--syncdelay", "1"),
    )
    rs.up()
    try:
        settings = Settings(
            mongo_uri=rs.uri,
            db=db_name,
            concurrency=2,
            lease_seconds=5,
            sweep_seconds=1,
            home=tmp_path / "home",
        )
        cluster = Cluster(settings, tmp_path)
        client = make_client(settings)
        store = JobStore(database(client, settings))
        oplog = client["local"]["oplog.rs"]
        try:
            first = cluster.dispatcher()
            await submit(store, "noop")
            first.wait_for_event("job.completed")
            assert first.stop() == 0
            ids = await submit(store, "noop", 20)

            async def oplog_ts(direction: int) -> Any:
                entry = await oplog.find_one({}, sort=[("$natural", direction)])
                assert entry is not None
                return entry["ts"]

            mark = await oplog_ts(-1)
            junk = store.db["junk"]
            deadline = time.monotonic() + 60
            while await oplog_ts(1) <= mark:
                assert time.monotonic() < deadline, "the oplog was never truncated"
                await junk.insert_many([{"blob": "x" * 500_000} for _ in range(4)])
                await asyncio.sleep(0.3)
            await junk.drop()
            second = cluster.dispatcher()
            second.wait_for_event("stream.history_lost", timeout=30)
            await wait_all_terminal(store, 21, timeout=60)
            await assert_clean(store, ids, first, second)
        finally:
            cluster.close()
            await client.drop_database(db_name)
            await client.close()
    finally:
        rs.down()
