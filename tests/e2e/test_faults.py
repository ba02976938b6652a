"""Failure is normal: fault injection on real processes and a real replica set.

Each test ends with the history checker over the jobs collection and the JSON logs.
Leases are short (seconds) so the suite stays fast and deterministic on two cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore
from tests.conftest import extra_port
from tests.e2e.conftest import Cluster
from tests.support.checker import check_history, settled_logs
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
    logs = await settled_logs(store, lambda: all_logs(*procs))
    report = await check_history(store, ids, logs, effects=effects)
    assert report.problems == [], "\n".join(report.problems)


# -- retries -----------------------------------------------------------------------------------


async def test_a_failing_task_is_retried_with_backoff_then_failed_with_its_traceback(
    cluster: Cluster, store: JobStore
) -> None:
    # Retry n waits min(cap, base·2^(n-1))·U(0.5, 1): 0.25-0.5 s, 0.5-1 s, then 1-2 s. The
    # sweep is slow, so only the due timer starts a retry.
    base = 0.5
    disp = cluster.dispatcher(
        BROOK_RETRY_BASE_SECONDS=str(base), BROOK_RETRY_CAP_SECONDS="30", BROOK_SWEEP_SECONDS="30"
    )
    [job_id] = await submit(store, "fail", payload={"message": "boom"}, max_attempts=4)
    flaky = await submit(store, "flaky", payload={"succeed_on": 2})
    await wait_all_terminal(store, 2)
    job = await store.get(job_id)
    assert job.status == "failed" and job.attempts == 4
    assert (
        job.error is not None
        and job.error["type"] == "DemoFailure"
        and job.error["message"] == "boom"
    )
    assert "Traceback" in job.error["traceback"] and "raise DemoFailure" in job.error["traceback"]
    # The spacing: from each failed attempt to the claim of the next one.
    steps = [(h["status"], h["at"]) for h in job.history]
    gaps = [
        (claimed - failed).total_seconds()
        for (s1, failed), (s2, claimed) in itertools.pairwise(steps[1:])
        if (s1, s2) == ("pending", "running")
    ]
    assert len(gaps) == 3, steps
    for attempt, gap in enumerate(gaps, start=1):
        full = base * 2 ** (attempt - 1)
        assert full / 2 <= gap <= full + 0.5, (attempt, gaps)
    assert [e["event"] for e in disp.logs() if e.get("job_id") == job_id].count(
        "job.retry_scheduled"
    ) == 3
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
    ids = await submit(store, "record", 6, payload={"seconds": 3.0})
    wait_until(lambda: len(a.events("task.started")) >= 2, timeout=15)
    workers = [int(e["pid"]) for e in a.events("task.started")]
    assert len(workers) == 2 and all(pid_alive(p) for p in workers)
    taken = {e["job_id"] for e in a.events("job.claimed")}
    assert len(taken) == 2  # concurrency 2, and 3 s jobs: none finished yet
    a.kill()  # SIGKILL: no release, no goodbye
    # The workers die with it, at once: not when their 3 s tasks end (a task that ended
    # would find its pipe closed and exit by itself).
    wait_until(lambda: not any(pid_alive(p) for p in workers), timeout=2)
    b = cluster.dispatcher()
    await wait_all_terminal(store, 6, timeout=60)
    expired = b.events("lease.expired")
    assert {e["job_id"] for e in expired} == taken and {e["owner"] for e in expired} == {a_owner(a)}
    logs = await settled_logs(store, lambda: all_logs(a, b))
    report = await check_history(store, ids, logs, effects=True)
    assert report.problems == [], "\n".join(report.problems)
    assert report.by_status() == {"completed": 6}
    for job_id in ids:  # the killed attempt counts; no other job was touched twice
        assert report.jobs[job_id]["attempts"] == (2 if job_id in taken else 1), job_id


def a_owner(proc: BrookProcess) -> str:
    return str(proc.events("dispatcher.started")[0]["owner"])


async def test_a_frozen_dispatcher_loses_its_lease_and_kills_its_worker_on_waking(
    cluster: Cluster, store: JobStore
) -> None:
    a = cluster.dispatcher()
    # Attempt 1 would take a minute; attempt 2 (elsewhere) half a second.
    [job_id] = await submit(store, "record", payload={"seconds": [60, 0.5]})
    pid = worker_pid(a, job_id)
    os.killpg(a.pid, signal.SIGSTOP)  # the dispatcher and its workers: nothing of it runs
    try:
        b = cluster.dispatcher()
        b.wait_for_event("lease.expired", timeout=20)
        b.wait_for_event("job.completed", timeout=20, where=lambda e: e["job_id"] == job_id)
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    # On waking, a's worker is still in attempt 1: a must stop it, fenced by its own clock
    # (the lease ran out while it was frozen) or told by its heartbeat that the lease is
    # gone, whichever comes first.
    killed = a.wait_for_event("worker.killed", timeout=10)
    assert killed["reason"] == "lease_lost" and killed["pid"] == pid
    told = a.events("lease.lost") + a.events("lease.self_fenced")
    assert [e["job_id"] for e in told] == [job_id]
    wait_until(lambda: not pid_alive(pid), timeout=5)
    job = await store.get(job_id)
    assert job.status == "completed" and job.attempts == 2 and job.result["attempt"] == 2
    assert not a.events("job.completed")
    effects = await store.db["effects"].find({}, projection={"_id": 0}).to_list()
    assert effects == [{"job_id": job_id, "attempt": 2, "n": None}]
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


class Load:
    """Several HTTP clients submitting `record` jobs of half a second, each code recorded."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.url = url
        self.acknowledged: list[str] = []
        self.codes: list[int] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.is_set():
                body = {"task": "record", "payload": {"seconds": 0.5}}
                try:
                    resp = client.post("/jobs", json=body)
                except httpx.HTTPError:
                    self.codes.append(-1)
                    continue
                self.codes.append(resp.status_code)
                if resp.status_code == 202:
                    self.acknowledged.append(resp.json()["id"])
                time.sleep(0.3)

    def more(self, n: int, timeout: float = 20) -> None:
        target = len(self.acknowledged) + n
        wait_until(lambda: len(self.acknowledged) >= target, timeout=timeout)


def direct(rs: Any, index: int) -> MongoClient[dict[str, Any]]:
    return MongoClient(
        f"mongodb://127.0.0.1:{rs.ports[index]}/?directConnection=true",
        serverSelectionTimeoutMS=5000,
    )


def fail_point(rs: Any, index: int, name: str, mode: Any, **data: Any) -> int:
    with direct(rs, index) as client:
        reply = client.admin.command("configureFailPoint", name, mode=mode, data=data)
    return int(reply["count"])


def current_primary(rs: Any) -> int:
    index = rs.primary_index()
    assert index is not None, "no primary"
    return int(index)


def running_now(jobs: Any) -> int:
    n: int = jobs.count_documents({"status": "running"})
    return n


def ran_across(docs: list[dict[str, Any]], moment: datetime) -> list[str]:
    """Jobs that were running (claimed, not yet ended) at `moment`."""
    out = []
    for doc in docs:
        for a, b in itertools.pairwise(doc["history"]):
            if a["status"] == "running" and a["at"] <= moment <= b["at"]:
                out.append(doc["_id"])
    return out


def own_set(tmp_path: Any, name: str) -> Any:
    """A replica set of the test's own (the shared one is never disturbed), with fail points
    and two-second election timeouts."""
    from brook.replset import ReplicaSet

    rs = ReplicaSet(
        home=tmp_path / "rs",
        base_port=extra_port(name),
        test_commands=True,
        election_timeout_ms=2000,
    )
    rs.up()
    return rs


def fault_settings(rs: Any, db_name: str, tmp_path: Any, **knobs: Any) -> Settings:
    """Short leases, sweeps and grace on `rs`: faults play out in seconds."""
    return Settings(
        mongo_uri=rs.uri,
        db=db_name,
        lease_seconds=5,
        sweep_seconds=1,
        shutdown_grace_seconds=2,
        home=tmp_path / "home",
        **knobs,
    )


@pytest.mark.timeout(420)  # its own waits add up to about 370 s
async def test_failover_under_load_loses_no_acknowledged_job_and_completes_none_twice(
    tmp_path: Any, db_name: str
) -> None:
    from brook.common.store.db import database, make_client

    # Elections well within the API's 5 s of patience: no client ever sees a 5xx, not even a 503.
    rs = own_set(tmp_path, "failover")
    settings = fault_settings(
        rs, db_name, tmp_path, concurrency=6, retry_base_seconds=0.05, retry_cap_seconds=0.5
    )
    cluster = Cluster(settings, tmp_path)
    client = make_client(settings)
    store = JobStore(database(client, settings))
    probe: MongoClient[dict[str, Any]] = MongoClient(rs.uri, tz_aware=True)
    jobs = probe[db_name]["jobs"]
    faults: dict[str, datetime] = {}
    try:
        cluster.api()
        disp = cluster.dispatcher()
        with Load(cluster.api_url) as load:
            load.more(10)
            # 1. Completions acknowledged without their write concern: the write was applied,
            #    the dispatcher is told it failed, and must neither lose nor repeat it.
            primary = current_primary(rs)
            before = fail_point(
                rs,
                primary,
                "failCommand",
                {"times": 10},
                failCommands=["update"],
                namespace=f"{db_name}.jobs",
                appName=f"brook-dispatcher:{disp.pid}",
                writeConcernError={
                    "code": 64,
                    "codeName": "WriteConcernFailed",
                    "errmsg": "injected by the test",
                    "errInfo": {"wtimeout": True},
                },
            )
            try:
                with direct(rs, primary) as c:
                    c.admin.command(
                        "waitForFailPoint", "failCommand", timesEntered=before + 10, maxTimeMS=20000
                    )
            finally:
                fail_point(rs, primary, "failCommand", "off")
            # 2. A step-down while jobs run.
            load.more(5)
            assert running_now(jobs) > 0
            faults["step-down"] = datetime.now(UTC)
            with direct(rs, primary) as c, contextlib.suppress(PyMongoError):
                c.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
            wait_until(lambda: rs.primary_index() not in (None, primary), timeout=30, interval=0.1)
            load.more(10)
            # 3. The primary killed while jobs run and its last writes are on no secondary:
            #    they were never acknowledged, and must not be lost or done twice either.
            primary = current_primary(rs)
            others = [i for i in range(rs.members) if i != primary]
            for i in others:
                fail_point(rs, i, "stopReplProducer", "alwaysOn")
            try:
                time.sleep(1.0)
                assert running_now(jobs) > 0
                faults["kill"] = datetime.now(UTC)
                rs.stop_member(primary, signal.SIGKILL)
                t_kill = time.monotonic()
            finally:
                for i in others:
                    fail_point(rs, i, "stopReplProducer", "off")
            wait_until(lambda: rs.primary_index() not in (None, primary), timeout=30, interval=0.1)
            load.more(10)
            recovered = time.monotonic() - t_kill
        assert recovered < 20, recovered
        assert set(load.codes) == {202}, sorted(set(load.codes))  # no 5xx, no dropped request
        await wait_all_terminal(store, len(load.acknowledged), timeout=60)
        docs = await store.jobs.find({}).to_list()
        for fault, moment in faults.items():
            assert ran_across(docs, moment), f"no job was running at the {fault}"
        await assert_clean(store, load.acknowledged, disp, effects=True)
    finally:
        try:
            cluster.close()
            probe.close()
            await client.close()
        finally:
            rs.down()  # a set of its own, in tmp_path: nothing else to clean


@pytest.mark.timeout(240)
async def test_a_job_claimed_before_it_replicated_then_rolled_back_runs_nowhere(
    tmp_path: Any, db_name: str
) -> None:
    """Insert hints let a dispatcher claim a job its primary has written but not yet
    replicated. If that primary dies, the insert and the claim are rolled back together:
    the job runs nowhere (it starts only once its claim is majority-acknowledged), and the
    dispatcher goes on with the new primary, its hints too."""
    from pymongo.write_concern import WriteConcern

    from brook.common.store.db import CODEC, database, make_client

    rs = own_set(tmp_path, "hints")
    settings = fault_settings(rs, db_name, tmp_path, concurrency=2)
    cluster = Cluster(settings, tmp_path)
    client = make_client(settings)
    store = JobStore(database(client, settings))
    # Writes that the primary acknowledges alone: no change stream shows them.
    lone = JobStore(client.get_database(db_name, codec_options=CODEC, write_concern=WriteConcern(1)))
    try:
        disp = cluster.dispatcher()
        disp.wait_for_event("hints.opened", timeout=10)
        primary = current_primary(rs)
        others = [i for i in range(rs.members) if i != primary]
        for i in others:
            fail_point(rs, i, "stopReplProducer", "alwaysOn")
        try:
            job_id = (await lone.submit(JobSpec(task="record", payload={"n": 1}))).job.id
            with direct(rs, primary) as c:
                jobs = c[db_name]["jobs"]
                # Claimed on the primary: the claim now waits for a majority that never comes.
                wait_until(lambda: (jobs.find_one({"_id": job_id}) or {}).get("status") == "running")
            time.sleep(0.5)
            assert not disp.events("task.started"), "a task started before its claim replicated"
            rs.stop_member(primary, signal.SIGKILL)
        finally:
            for i in others:
                fail_point(rs, i, "stopReplProducer", "off")
        wait_until(lambda: rs.primary_index() not in (None, primary), timeout=30, interval=0.1)
        wait_until(lambda: len(disp.events("hints.opened")) >= 2, timeout=30)  # the new primary's
        [after] = await submit(store, "record", payload={"n": 2})
        await wait_until_status(store, after, "completed", timeout=30)
        assert await store.jobs.find_one({"_id": job_id}) is None  # rolled back, claim and all
        effects = await store.db["effects"].find({}, {"_id": 0}).to_list()
        assert effects == [{"job_id": after, "attempt": 1, "n": 2}]
        told = [e["event"] for e in disp.logs() if e.get("job_id") == job_id]
        assert told == [], told
        await assert_clean(store, [after], disp, effects=True)
    finally:
        try:
            cluster.close()
            await client.close()
        finally:
            rs.down()  # a set of its own, in tmp_path: nothing else to clean


# -- history lost ------------------------------------------------------------------------------


async def fall_off_the_oplog(store: JobStore, oplog: Any) -> None:
    """Write junk until the oplog no longer holds anything written before this call."""

    async def oplog_ts(direction: int) -> Any:
        entry = await oplog.find_one({}, sort=[("$natural", direction)])
        assert entry is not None
        return entry["ts"]

    mark = await oplog_ts(-1)
    junk = store.db["junk"]
    deadline = time.monotonic() + 30
    while await oplog_ts(1) <= mark:
        assert time.monotonic() < deadline, "the oplog was never truncated"
        await junk.insert_many([{"blob": "x" * 500_000} for _ in range(4)])
        await asyncio.sleep(0.3)
    await junk.drop()


async def start_at_once(store: JobStore, n: int) -> list[str]:
    """Submit `n` jobs one by one; each must start within a second (the stream's news, not
    a sweep)."""
    ids = []
    for _ in range(n):
        [job_id] = await submit(store, "noop")
        await wait_until_status(store, job_id, "completed", timeout=5)
        job = await store.get(job_id)
        assert job.started_at is not None
        assert (job.started_at - job.created_at).total_seconds() < 1.0, job
        ids.append(job_id)
    return ids


@pytest.mark.timeout(420)  # its own waits add up to about 380 s
async def test_a_dispatcher_whose_token_fell_off_the_oplog_sweeps_and_runs_everything(
    tmp_path: Any, db_name: str
) -> None:
    from brook.common.store.db import database, make_client
    from brook.replset import ReplicaSet

    # A 1 MB oplog and a checkpoint every second, so the oplog really is truncated.
    rs = ReplicaSet(
        home=tmp_path / "tiny",
        base_port=extra_port("tiny_oplog"),
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
            sweep_seconds=120,  # no watchdog sweep during the test: only the reset path helps
            home=tmp_path / "home",
        )
        cluster = Cluster(settings, tmp_path)
        client = make_client(settings)
        store = JobStore(database(client, settings))
        oplog = client["local"]["oplog.rs"]
        try:
            # 1. A restarted dispatcher whose saved token fell off the oplog.
            first = cluster.dispatcher()
            ids = await submit(store, "noop")
            first.wait_for_event("job.completed")
            assert first.stop() == 0
            missed = await submit(store, "noop", 20)
            await fall_off_the_oplog(store, oplog)
            second = cluster.dispatcher()
            second.wait_for_event("stream.history_lost", timeout=30)
            await wait_all_terminal(store, 21, timeout=10)
            ids += missed + await start_at_once(store, 3)  # a fresh stream follows
            # 2. A running dispatcher whose stream falls off the oplog (frozen meanwhile): the
            #    jobs submitted in between are found by the reset path's sweep, at once.
            os.killpg(second.pid, signal.SIGSTOP)
            try:
                # A decoy answers the stream's pending getMore, so no later insert can reach
                # the frozen dispatcher except through the reset's sweep.
                later = datetime.now(UTC) + timedelta(hours=1)
                [decoy] = await submit(store, "noop", run_at=later)
                await asyncio.sleep(0.5)
                late = await submit(store, "noop", 10)
                await fall_off_the_oplog(store, oplog)
            finally:
                os.killpg(second.pid, signal.SIGCONT)
            wait_until(lambda: len(second.events("stream.history_lost")) == 2, timeout=30)
            await wait_all_terminal(store, len(ids) + 10, timeout=5)
            await store.cancel(decoy)
            ids += [decoy, *late, *await start_at_once(store, 3)]
            await assert_clean(store, ids, first, second)
        finally:
            cluster.close()
            await client.drop_database(db_name)
            await client.close()
    finally:
        rs.down()
