"""Durable execution on real processes: steps that survive a SIGKILLed worker or dispatcher,
transactional steps under a step-down, sleeps that free their worker, and signals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pymongo import MongoClient
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern

from brook import AsyncClient, Job
from brook.common.domain.models import Doc, JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster, free_port
from tests.support.procs import BrookProcess, wait_until
from tests.support.sse import read_events

DURABLE = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.durable"}


async def submit(store: JobStore, task: str, payload: dict[str, Any], **kw: Any) -> str:
    return (await store.submit(JobSpec(task=task, payload=payload, **kw))).job.id


async def finished(store: JobStore, job_id: str, timeout: float = 60) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = await store.get(job_id)
        if job.status in ("completed", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, f"job still {job.status}: {job}"
        await asyncio.sleep(0.1)


async def suspended(store: JobStore, job_id: str, timeout: float = 30) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = await store.get(job_id)
        if job.status == "pending" and job.waiting_for is not None:
            return job
        assert time.monotonic() < deadline, f"job not suspended: {job}"
        await asyncio.sleep(0.05)


def holding(proc: BrookProcess, job_id: str) -> int:
    """The pid of the worker whose task logged `step.holding` for this job."""
    event = proc.wait_for_event(
        "step.holding", timeout=30, where=lambda e: e.get("job_id") == job_id
    )
    return int(event["pid"])


async def rows_by_step(store: JobStore, job_id: str) -> dict[int, list[int]]:
    """Effect rows per step: the attempts that inserted them."""
    out: dict[int, list[int]] = {}
    async for row in store.db["effects"].find({"job_id": job_id}):
        out.setdefault(row["step"], []).append(row["attempt"])
    return out


def assert_five_steps_replayed(job: Job, rows: dict[int, list[int]]) -> None:
    assert job.status == "completed" and job.attempts == 2, job
    assert job.result == [1, 2, 3, 4, 5]
    # Steps 1-3 ran once, in attempt 1; attempt 2 replayed them and ran 4 and 5.
    assert rows == {1: [1], 2: [1], 3: [1], 4: [2], 5: [2]}, rows
    assert [(s["name"], s["attempt"]) for s in job.steps] == [
        ("step-1", 1),
        ("step-2", 1),
        ("step-3", 1),
        ("step-4", 2),
        ("step-5", 2),
    ]


# -- steps -------------------------------------------------------------------------------------


async def test_a_worker_sigkilled_inside_step_four_replays_steps_one_to_three_without_running_them(
    cluster: Cluster, store: JobStore
) -> None:
    port = free_port()
    disp = cluster.dispatcher(**DURABLE, BROOK_METRICS_PORT=str(port))
    job_id = await submit(store, "five_steps", {"hold_in": 4, "hold": 60})
    pid = holding(disp, job_id)
    os.kill(pid, signal.SIGKILL)
    job = await finished(store, job_id)
    assert_five_steps_replayed(job, await rows_by_step(store, job_id))
    assert [h.get("error") for h in job.history if h.get("error")] == ["WorkerCrashed"]
    replays = [e["step"] for e in disp.events("step.replayed") if e.get("job_id") == job_id]
    assert replays == ["step-1", "step-2", "step-3"]
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert 'brook_steps_total{how="run",task="five_steps"} 5.0' in metrics
    assert 'brook_steps_total{how="replayed",task="five_steps"} 3.0' in metrics


async def test_a_dispatcher_sigkilled_inside_step_four_leaves_steps_one_to_three_done(
    cluster: Cluster, store: JobStore
) -> None:
    a = cluster.dispatcher(**DURABLE)
    job_id = await submit(store, "five_steps", {"hold_in": 4, "hold": 60})
    holding(a, job_id)
    a.kill()  # SIGKILL: its worker dies with it; the lease expires
    b = cluster.dispatcher(**DURABLE)
    job = await finished(store, job_id)
    assert_five_steps_replayed(job, await rows_by_step(store, job_id))
    assert any(e["job_id"] == job_id for e in b.events("lease.expired"))


async def test_a_zombie_dispatcher_frozen_past_its_lease_records_no_checkpoint(
    cluster: Cluster, store: JobStore
) -> None:
    a = cluster.dispatcher(**DURABLE)
    job_id = await submit(store, "five_steps", {"hold_in": 3, "hold": 3})
    holding(a, job_id)  # attempt 1 is inside step 3
    os.killpg(a.pid, signal.SIGSTOP)  # the dispatcher and its worker: frozen
    try:
        b = cluster.dispatcher(**DURABLE)
        b.wait_for_event("lease.expired", timeout=30, where=lambda e: e["job_id"] == job_id)
        job = await finished(store, job_id)
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    # On waking, a's worker finishes step 3 of attempt 1 and asks a to record it; a's fence
    # (attempt 1, owner a) matches nothing, or a kills the worker first: for its lost lease,
    # or fenced by its own clock (the lease ran out while it was frozen).
    wait_until(
        lambda: [
            e
            for e in a.events("lease.lost")
            + a.events("lease.self_fenced")
            + a.events("step.discarded")
            if e.get("job_id") == job_id
        ],
        timeout=15,
    )
    await asyncio.sleep(1.0)
    assert not [
        e for e in a.events("step.recorded") if e["job_id"] == job_id and e["step"] == "step-3"
    ]
    job = await store.get(job_id)
    assert job.status == "completed" and job.attempts == 2
    assert [(s["name"], s["attempt"]) for s in job.steps] == [
        ("step-1", 1),
        ("step-2", 1),
        ("step-3", 2),
        ("step-4", 2),
        ("step-5", 2),
    ]


async def test_plain_def_steps_replay_and_a_failing_step_is_named_in_the_history(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**DURABLE)
    job_id = await submit(store, "sync_steps", {})
    job = await finished(store, job_id)
    assert job.status == "completed" and job.attempts == 2
    assert job.result == [{"n": 1, "attempt": 1}, {"n": 2, "attempt": 2}, {"n": 3, "attempt": 2}]
    rows = await rows_by_step(store, job_id)
    assert rows == {1: [1], 2: [1, 2], 3: [2]}  # step 1 never ran again
    failed = [h for h in job.history if h.get("error") == "RuntimeError"]
    assert failed and failed[0]["step"] == "s2"
    assert disp.events("step.failed")[0]["step"] == "s2"


async def test_a_repeated_step_name_or_an_unstorable_result_fails_with_the_step_named(
    cluster: Cluster, store: JobStore
) -> None:
    cluster.dispatcher(**DURABLE)
    ids = {
        what: await submit(store, "step_misuse", {"what": what}, max_attempts=1)
        for what in ("duplicate", "too_large", "not_bson")
    }
    dup = await finished(store, ids["duplicate"])
    assert dup.status == "failed" and dup.error is not None
    assert dup.error["type"] == "DuplicateStep" and "'same'" in dup.error["message"]
    big = await finished(store, ids["too_large"])
    assert big.error is not None and big.error["type"] == "StepError"
    assert "'big'" in big.error["message"] and "1048576" in big.error["message"]
    odd = await finished(store, ids["not_bson"])
    assert odd.error is not None and "'odd'" in odd.error["message"]


# -- sleeps ------------------------------------------------------------------------------------


async def test_a_sleeping_job_frees_its_only_worker_for_three_others_then_wakes_on_time(
    cluster: Cluster, store: JobStore
) -> None:
    cluster.dispatcher(**DURABLE, BROOK_CONCURRENCY="1")
    sleeper = await submit(store, "sleeper", {"seconds": 5})
    asleep = await suspended(store, sleeper)
    assert asleep.waiting_for is not None and asleep.waiting_for["kind"] == "sleep"
    wake_at = asleep.waiting_for["until"]
    others = [await submit(store, "record", {"seconds": 0.3, "n": i}) for i in range(3)]
    done = [await finished(store, job_id) for job_id in others]
    assert all(j.status == "completed" for j in done)
    job = await finished(store, sleeper)
    assert job.status == "completed" and job.attempts == 2
    assert job.max_attempts == 4  # the sleep used none of its attempts
    assert not [h for h in job.history if h.get("error")]  # and was no failure
    woke = [h for h in job.history if h["status"] == "running"][-1]["at"]
    assert woke >= wake_at, (woke, wake_at)  # no earlier than its wake time, server clock
    assert all(j.finished_at is not None and j.finished_at < woke for j in done)
    assert job.result["after"] - job.result["before"] >= 4.9


async def test_a_sleep_outlives_the_dispatcher_that_suspended_it(
    cluster: Cluster, store: JobStore
) -> None:
    a = cluster.dispatcher(**DURABLE)
    sleeper = await submit(store, "sleeper", {"seconds": 4})
    asleep = await suspended(store, sleeper)
    a.kill()  # SIGKILL while the job sleeps: it holds no lease, nothing to expire
    cluster.dispatcher(**DURABLE)
    job = await finished(store, sleeper)
    assert job.status == "completed" and job.attempts == 2
    assert asleep.waiting_for is not None
    woke = [h for h in job.history if h["status"] == "running"][-1]["at"]
    assert woke >= asleep.waiting_for["until"]


async def test_a_plain_def_task_sleeps_durably_too(cluster: Cluster, store: JobStore) -> None:
    cluster.dispatcher(**DURABLE)
    job_id = await submit(store, "sync_sleeper", {"seconds": 2})
    await suspended(store, job_id)
    job = await finished(store, job_id)
    assert job.status == "completed" and job.result == "awake" and job.attempts == 2


# -- signals -----------------------------------------------------------------------------------


async def test_a_signal_sent_over_http_wakes_its_waiting_job(
    cluster: Cluster, store: JobStore, http: httpx.Client
) -> None:
    cluster.api(**DURABLE)
    cluster.dispatcher(**DURABLE)
    job_id = await submit(store, "waiter", {"key": "approval:1"})
    waiting = await suspended(store, job_id)
    assert waiting.waiting_for is not None and waiting.waiting_for["key"] == "approval:1"
    seen = http.get(f"/jobs/{job_id}").json()
    assert seen["waiting_for"]["kind"] == "signal" and seen["waiting_for"]["key"] == "approval:1"
    answer = http.post("/signals/approval:1", json={"payload": {"approved": True}})
    assert answer.status_code == 200 and answer.json() == {"woken": 1}
    job = await finished(store, job_id)
    assert job.status == "completed" and job.result == {"signal": {"approved": True}}
    shown = http.get(f"/jobs/{job_id}").json()
    assert [s["name"] for s in shown["steps"]] == ["signal:approval:1#1"]
    assert "result" not in shown["steps"][0] and shown["steps"][0]["size"] > 0


async def test_a_signal_sent_before_its_wait_is_kept_and_returned_at_once(
    cluster: Cluster, store: JobStore, settings: Settings
) -> None:
    cluster.dispatcher(**DURABLE)
    async with AsyncClient(settings.mongo_uri, settings.db) as client:
        assert await client.signal("early", {"n": 1}) == 0
    job_id = await submit(store, "sync_waiter", {"key": "early"})
    job = await finished(store, job_id)
    assert job.status == "completed" and job.result == {"signal": {"n": 1}}
    assert job.attempts == 1 and job.waiting_for is None  # never suspended


async def test_a_wait_that_times_out_raises_signal_timeout_in_the_task(
    cluster: Cluster, store: JobStore
) -> None:
    cluster.dispatcher(**DURABLE)
    job_id = await submit(store, "waiter", {"key": "never", "timeout": 2})
    waiting = await suspended(store, job_id)
    assert waiting.waiting_for is not None and waiting.waiting_for["until"] is not None
    job = await finished(store, job_id)
    assert job.status == "completed" and job.result == {"timed_out": True}


async def test_a_waiting_job_is_cancelled_at_once_and_bad_signals_get_422(
    cluster: Cluster, store: JobStore, http: httpx.Client
) -> None:
    cluster.api(**DURABLE)
    cluster.dispatcher(**DURABLE)
    job_id = await submit(store, "waiter", {"key": "cancel-me"})
    await suspended(store, job_id)
    cancelled = http.post(f"/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert http.post("/signals/cancel-me", json={"payload": 1}).json() == {"woken": 0}
    assert (await store.get(job_id)).status == "cancelled"
    assert http.post("/signals/bad key!", json={"payload": 1}).status_code == 422
    # A trailing newline is not part of a key (`$` would have let it through).
    assert http.post("/signals/cancel-me%0A", json={"payload": 1}).status_code == 422
    big = {"payload": "x" * (300 * 1024)}
    assert http.post("/signals/ok-key", json=big).status_code == 422
    assert http.post("/signals/ok-key", json={"nope": 1}).status_code == 422


async def test_a_signal_sent_while_its_waiter_is_being_suspended_is_not_lost(
    cluster: Cluster, store: JobStore, settings: Settings, tmp_path: Any
) -> None:
    """The signal lands between the worker's look (nothing sent yet) and the suspend write
    (held 3 s on the server): its sender wakes no one, as the job is still running, so only
    the look that follows the suspend write can wake it. No sweep falls in the test."""
    disp = cluster.dispatcher(**DURABLE, BROOK_SWEEP_SECONDS="300")
    gate = tmp_path / "gate"
    job_id = await submit(store, "gated_waiter", {"key": "approval:1", "gate": str(gate)})
    disp.wait_for_event("task.started", timeout=30, where=lambda e: e.get("job_id") == job_id)
    admin = store.db.client.admin
    app = f"brook-dispatcher:{disp.pid}"
    # findAndModify: the suspend write's command (`write_held`); a lease renewal is an
    # update, so it cannot take the one hold. The claim came before the fail point.
    armed = await admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": 1},
        data={
            "failCommands": ["findAndModify"],
            "appName": app,
            "blockConnection": True,
            "blockTimeMS": 3000,
        },
    )
    try:
        gate.touch()
        await admin.command(
            "waitForFailPoint", "failCommand", timesEntered=armed["count"] + 1, maxTimeMS=30000
        )
        local = store.db.client.get_database("admin", read_concern=ReadConcern("local"))
        held = await (
            await local.aggregate(
                [{"$currentOp": {"allUsers": True}}, {"$match": {"appName": app}}]
            )
        ).to_list()
        suspends = [
            op
            for op in held
            if op.get("command", {}).get("findAndModify") == "jobs"
            and op["command"].get("query", {}).get("_id") == job_id
            and "waiting_for" in str(op["command"].get("update"))
        ]
        assert suspends, held  # the hold is this job's suspend write, and it is in flight
        async with AsyncClient(settings.mongo_uri, settings.db) as client:
            assert await client.signal("approval:1", {"approved": True}) == 0  # still running
        assert (await store.get(job_id)).status == "running"
    finally:
        await admin.command("configureFailPoint", "failCommand", mode="off")
    job = await finished(store, job_id, timeout=30)  # the sweep is 300 s away
    assert job.status == "completed" and job.result == {"signal": {"approved": True}}, job
    assert [e for e in disp.events("job.woken") if e.get("job_id") == job_id]


async def test_a_thousand_waiting_jobs_are_woken_by_a_thousand_signals_without_polling(
    cluster: Cluster, store: JobStore, settings: Settings
) -> None:
    # No sweep falls in the idle window below, however long a loaded machine takes to get
    # the 1,000 jobs waiting (at 30 s, one did: the window must see no poll, not no sweep).
    cluster.dispatcher(**DURABLE, BROOK_SWEEP_SECONDS="3600", BROOK_CONCURRENCY="4")
    n = 1000
    subs = await store.submit_many(
        [JobSpec(task="waiter", payload={"key": f"k-{i}"}) for i in range(n)]
    )
    ids = [s.job.id for s in subs]
    deadline = time.monotonic() + 240
    while await store.jobs.count_documents({"status": "pending", "waiting_for.kind": "signal"}) < n:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.5)
    await store.db.command("profile", 2)
    try:
        since = datetime.now(UTC)
        await asyncio.sleep(3.0)
        idle = (
            await store.db["system.profile"]
            .find(
                {
                    "ts": {"$gte": since},
                    "op": {"$ne": "getmore"},
                    "ns": {"$regex": r"\.(jobs|brook_signals)$"},
                }
            )
            .to_list()
        )
        # 1,000 jobs wait, and nobody looks: no sweep is due, nothing polls the jobs or the
        # signals.
        assert len(idle) <= 3, [(o.get("op"), o.get("ts"), o.get("command")) for o in idle]
        since = datetime.now(UTC)
        async with AsyncClient(settings.mongo_uri, settings.db) as client:
            woken = await asyncio.gather(*[client.signal(f"k-{i}", i) for i in range(n)])
        assert sum(woken) == n
        while await store.jobs.count_documents({"status": "completed"}) < n:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
        reads = await store.db["system.profile"].count_documents(
            {"ts": {"$gte": since}, "op": "query", "ns": f"{settings.db}.brook_signals"}
        )
    finally:
        await store.db.command("profile", 0)
    # Each woken job's replay reads its signal once: no read in a loop.
    assert reads <= n, reads
    results = {d["_id"]: d["result"] async for d in store.jobs.find({"_id": {"$in": ids}})}
    assert sorted(r["signal"] for r in results.values()) == list(range(n))


# -- transactional steps -----------------------------------------------------------------------


async def orders_by_step(store: JobStore, job_id: str) -> dict[int, int]:
    out: dict[int, int] = {}
    async for row in store.db["orders"].find({"job_id": job_id}):
        out[row["step"]] = out.get(row["step"], 0) + 1
    return out


async def test_transactional_steps_commit_their_rows_with_their_checkpoint_exactly_once(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**DURABLE)
    job_id = await submit(store, "tx_steps", {"hold_in": 3, "hold": 60, "rows": 3})
    pid = holding(disp, job_id)  # inside step 3's transaction, its rows written
    os.kill(pid, signal.SIGKILL)
    job = await finished(store, job_id)
    assert job.status == "completed" and job.attempts == 2 and job.result == [1, 2, 3]
    # Steps 1 and 2 committed once (replayed by attempt 2); step 3's first transaction died
    # with its worker, leaving neither rows nor checkpoint.
    assert await orders_by_step(store, job_id) == {1: 3, 2: 3, 3: 3}
    assert [(s["name"], s["attempt"]) for s in job.steps] == [
        ("tx-1", 1),
        ("tx-2", 1),
        ("tx-3", 2),
    ]


async def test_plain_def_transactional_steps_commit_their_rows_with_their_checkpoint_or_neither(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**DURABLE)
    job_id = await submit(store, "sync_tx_steps", {})
    job = await finished(store, job_id)
    assert job.status == "completed" and job.attempts == 2, job.error
    assert job.result == [{"n": 1, "attempt": 1}, {"n": 2, "attempt": 2}]
    # Step 1 committed once and was replayed; step 2's first transaction was aborted with
    # its exception, leaving neither rows nor checkpoint.
    assert await orders_by_step(store, job_id) == {1: 3, 2: 3}
    assert [(s["name"], s["attempt"]) for s in job.steps] == [("stx-1", 1), ("stx-2", 2)]
    assert disp.events("step.failed")[0]["step"] == "stx-2"


async def test_a_step_down_during_a_transactional_steps_commit_leaves_rows_and_checkpoint_or_neither(
    cluster: Cluster, store: JobStore, mongo: Any
) -> None:
    rs = mongo.replset
    assert rs is not None, "needs the embedded replica set"
    disp = cluster.dispatcher(**DURABLE)
    old = rs.primary_index()
    direct: MongoClient[Doc] = MongoClient(
        f"mongodb://127.0.0.1:{rs.ports[old]}/?directConnection=true"
    )
    # Steps 1 and 2 commit; step 3's commit waits 2 s on the primary: step it down then.
    armed = direct.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"skip": 2},
        data={"failCommands": ["commitTransaction"], "blockConnection": True, "blockTimeMS": 2000},
    )
    try:
        job_id = await submit(store, "tx_steps", {"rows": 3}, max_attempts=5)
        direct.admin.command(
            # The fail point counts the commits it holds, not the ones it skips.
            "waitForFailPoint",
            "failCommand",
            timesEntered=armed["count"] + 1,
            maxTimeMS=30000,
        )
        with contextlib.suppress(PyMongoError):  # the stepping-down primary hangs up
            direct.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
    finally:
        with contextlib.suppress(PyMongoError):
            direct.admin.command("configureFailPoint", "failCommand", mode="off")
        direct.close()
    wait_until(lambda: rs.primary_index() not in (None, old), timeout=60, interval=0.2)
    job = await finished(store, job_id, timeout=90)
    assert job.status == "completed" and job.result == [1, 2, 3]
    # Whatever the commit's fate, each step's rows and its checkpoint exist together, once.
    assert await orders_by_step(store, job_id) == {1: 3, 2: 3, 3: 3}
    assert [s["name"] for s in job.steps] == ["tx-1", "tx-2", "tx-3"]
    assert disp.events("dispatcher.ready")


async def test_brook_signal_wakes_a_waiting_plain_def_task(
    cluster: Cluster, store: JobStore
) -> None:
    cluster.api(**DURABLE)
    cluster.dispatcher(**DURABLE)
    job_id = await submit(store, "sync_waiter", {"key": "webhook:7"})
    await suspended(store, job_id)
    out = cluster.cli("signal", "webhook:7", "--payload", '{"paid": 12.5}')
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"woken": 1}
    job = await finished(store, job_id)
    assert job.status == "completed" and job.result == {"signal": {"paid": 12.5}}
    bad = cluster.cli("signal", "no spaces", "--payload", "1")
    assert bad.returncode != 0 and "422" in bad.stderr


def test_a_jobs_event_stream_carries_its_steps_its_sleep_and_its_wake(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(**DURABLE)
    cluster.dispatcher(**DURABLE)
    soon = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()  # read from its start
    body = {"task": "sleeper", "payload": {"seconds": 2}, "run_at": soon}
    job_id = http.post("/jobs", json=body).json()["id"]
    events = read_events(f"{cluster.api_url}/jobs/{job_id}/events", timeout=30)
    seen = [
        (e.status, [s["name"] for s in e.data["steps"]], (e.data["waiting_for"] or {}).get("kind"))
        for e in events
    ]
    assert ("running", ["before"], None) in seen  # a step
    assert ("running", ["before", "sleep#1"], None) in seen  # the sleep's wake time
    assert ("pending", ["before", "sleep#1"], "sleep") in seen  # asleep, no worker
    asleep = seen.index(("pending", ["before", "sleep#1"], "sleep"))
    assert any(status == "running" and kind is None for status, _, kind in seen[asleep:])  # woke
    assert seen[-1] == ("completed", ["before", "sleep#1", "after"], None)
    assert all("result" not in s for e in events for s in e.data["steps"])


async def test_a_sleeping_job_frees_its_queues_slot_and_its_dependents_wait_for_its_end(
    cluster: Cluster, store: JobStore, http: httpx.Client
) -> None:
    cluster.api(**DURABLE)
    cluster.dispatcher(**DURABLE)
    limited = http.put("/queues/slow", json={"concurrency": 1})
    assert limited.status_code == 200, limited.text
    made = http.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"task": "sleeper", "payload": {"seconds": 3}, "queue": "slow", "ref": "p"},
                {"task": "echo", "payload": {"child": True}, "depends_on": ["p"]},
            ]
        },
    ).json()["jobs"]
    parent, child = made[0]["id"], made[1]["id"]
    await suspended(store, parent)
    # The queue's one slot is free while the parent sleeps: another job of it runs now.
    other = await submit(store, "record", {"seconds": 0.1}, queue="slow")
    assert (await finished(store, other, timeout=20)).status == "completed"
    assert (await store.get(parent)).status == "pending"
    assert (await store.get(child)).status == "waiting"  # its parent has not completed
    done = await finished(store, parent)
    assert done.status == "completed"
    kid = await finished(store, child)
    assert kid.status == "completed" and kid.result == {"child": True}


# -- code changed under a job -----------------------------------------------------------------


@pytest.mark.parametrize("task", ["changing", "sync_changing"])
async def test_changed_keeps_a_job_on_the_old_path_across_a_replay_that_straddles_the_deploy(
    cluster: Cluster, store: JobStore, settings: Settings, task: str
) -> None:
    cluster.dispatcher(**DURABLE)
    before = await submit(store, task, {"key": "old-job"})
    await suspended(store, before)  # fetched on the old code, waits for its first signal
    await store.db["deploys"].insert_one({"_id": task})  # the deploy
    after = await submit(store, task, {"key": "new-job"})
    await suspended(store, after)
    async with AsyncClient(settings.mongo_uri, settings.db) as client:
        for key in ("old-job-1", "new-job-1", "old-job-2", "new-job-2"):
            await client.signal(key)
            if key.endswith("-1"):  # replayed once, up to its second wait
                job_id = before if key.startswith("old") else after
                await wait_until_async(
                    store, job_id, lambda j, key=key: f"signal:{key}#1" in step_names(j)
                )
                await suspended(store, job_id)
    old, new = await finished(store, before), await finished(store, after)
    # The job that fetched before the deploy replays its recorded `fetch`: the new code's
    # `fetch-v2` never runs for it. The job made after it runs the new code from the start.
    assert old.result == {"fetched": "old", "deployed": True}, old
    assert new.result == {"fetched": "new", "deployed": True}, new
    assert step_names(old) == ["fetch", "changed#v2", "signal:old-job-1#1", "signal:old-job-2#1"]
    assert step_names(new) == ["changed#v2", "fetch-v2", "signal:new-job-1#1", "signal:new-job-2#1"]
    recorded = {j.id: {s["name"]: s.get("result") for s in j.steps} for j in (old, new)}
    assert recorded[before]["changed#v2"] is False and recorded[after]["changed#v2"] is True
    rows = [(r["job_id"], r["version"]) async for r in store.db["effects"].find()]
    assert sorted(rows) == sorted([(before, "old"), (after, "new")])


def step_names(job: Job) -> list[str]:
    return [s["name"] for s in job.steps]


async def wait_until_async(store: JobStore, job_id: str, check: Any, timeout: float = 30) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = await store.get(job_id)
        if check(job):
            return job
        assert time.monotonic() < deadline, f"never true: {job}"
        await asyncio.sleep(0.05)
