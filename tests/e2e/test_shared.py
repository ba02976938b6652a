"""Shared jobs (`@task(..., shared=N)`): many jobs in one worker process, each still on its
own for timeouts, cancels, crashes, steps and limits. Real dispatchers, real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx

from brook import AsyncClient
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore
from brook.common.store.queues import QueueStore
from tests.e2e.conftest import Cluster, free_port
from tests.e2e.test_faults import assert_clean, submit, wait_all_terminal, wait_until_status
from tests.support.limits import max_overlap, runs
from tests.support.procs import BrookProcess, pid_alive, wait_until

SHARED = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.shared", "BROOK_CONCURRENCY": "1"}


def started(proc: BrookProcess, ids: list[str]) -> dict[str, int]:
    """The worker pid of each of `ids` whose task has started (attempt 1)."""
    wanted = set(ids)
    return {
        e["job_id"]: int(e["pid"])
        for e in proc.events("task.started")
        if e.get("job_id") in wanted and e.get("attempt") == 1
    }


def wait_started(proc: BrookProcess, ids: list[str], timeout: float = 30) -> dict[str, int]:
    wait_until(lambda: len(started(proc, ids)) == len(ids), timeout=timeout)
    return started(proc, ids)


async def effects_by_job(store: JobStore) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    async for row in store.db["effects"].find({}, {"_id": 0}):
        out.setdefault(row["job_id"], []).append(row)
    return out


async def test_a_sigkilled_shared_process_with_50_jobs_in_flight_loses_none_and_runs_none_twice(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**SHARED)
    ids = await submit(store, "shared_wait", 50, payload={"seconds": 60, "later": 0.05})
    pids = set(wait_started(disp, ids).values())
    assert len(pids) == 1  # all fifty in one shared worker process
    [pid] = pids
    os.kill(pid, signal.SIGKILL)
    await wait_all_terminal(store, 50, timeout=60)
    effects = await effects_by_job(store)
    for job_id in ids:
        job = await store.get(job_id)
        assert job.status == "completed", (job_id, job.status, job.error)
        # The death took one attempt (the fencing token counts it) but not the budget.
        assert job.attempts == 2 and job.max_attempts == 4
        ends = [h for h in job.history if h.get("attempt") and h["status"] != "running"]
        assert [(h["status"], h.get("error"), h.get("shared")) for h in ends] == [
            ("pending", "WorkerCrashed", True),
            ("completed", None, True),
        ]
        assert effects[job_id] == [{"job_id": job_id, "attempt": 2}]  # once, by attempt 2
    crashed = disp.wait_for_event("worker.crashed", where=lambda e: e.get("pid") == pid)
    assert sorted(crashed["job_ids"]) == sorted(ids)
    await assert_clean(store, ids, disp)


async def test_one_of_100_shared_jobs_times_out_another_is_cancelled_and_98_complete(
    cluster: Cluster, store: JobStore, http: httpx.Client
) -> None:
    cluster.api()
    disp = cluster.dispatcher(**SHARED)
    ids = [
        (await submit(store, "shared_wait", payload={"seconds": 1.5, "n": n}))[0]
        for n in range(98)
    ]
    [slow] = await submit(store, "shared_wait", payload={"seconds": 60}, timeout_s=1, max_attempts=1)
    [doomed] = await submit(store, "shared_wait", payload={"seconds": 60})
    pids = set(wait_started(disp, [*ids, slow, doomed]).values())
    assert len(pids) == 1
    assert http.post(f"/jobs/{doomed}/cancel").status_code == 200
    await wait_all_terminal(store, 100, timeout=60)
    t = await store.get(slow)
    assert t.status == "failed" and t.error is not None and t.error["type"] == "Timeout"
    c = await store.get(doomed)
    assert c.status == "cancelled"
    for n, job_id in enumerate(ids):
        job = await store.get(job_id)
        assert job.status == "completed" and job.attempts == 1
        assert job.result == {"n": n, "job": job_id}
    # Only the two asyncio tasks ended: their process lives on, nothing was killed.
    assert disp.events("worker.killed") == [] and disp.events("worker.crashed") == []
    assert all(pid_alive(p) for p in pids)
    await assert_clean(store, [*ids, slow, doomed], disp)


async def test_a_shared_jobs_durable_steps_replay_after_its_process_is_killed_mid_step(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**SHARED)
    [job_id] = await submit(store, "shared_steps", payload={"hold_in": 3})
    holding = disp.wait_for_event("step.holding", where=lambda e: e.get("job_id") == job_id)
    os.kill(int(holding["pid"]), signal.SIGKILL)
    await wait_all_terminal(store, 1, timeout=30)
    job = await store.get(job_id)
    assert job.status == "completed" and job.result == [1, 2, 3, 4, 5]
    rows = sorted((r["step"], r["attempt"]) for r in (await effects_by_job(store))[job_id])
    assert rows == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]  # each step's effect once
    replayed = [e["step"] for e in disp.events("step.replayed") if e.get("job_id") == job_id]
    assert replayed == ["step-1", "step-2"]
    await assert_clean(store, [job_id], disp)


async def test_a_shared_job_that_blocks_the_event_loop_is_reported_with_its_job_id(
    cluster: Cluster, store: JobStore
) -> None:
    port = free_port()
    disp = cluster.dispatcher(
        **SHARED, BROOK_LOOP_BLOCKED_SECONDS="0.2", BROOK_METRICS_PORT=str(port)
    )
    [job_id] = await submit(store, "shared_block", payload={"seconds": 1.0})
    blocked = disp.wait_for_event(
        "worker.loop_blocked", where=lambda e: job_id in e.get("job_ids", [])
    )
    assert blocked["worker"].startswith("s") and "asyncio.to_thread" in blocked["remedy"]
    await wait_all_terminal(store, 1)

    def counted() -> bool:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        lines = [x for x in text.splitlines() if x.startswith("brook_worker_loop_blocked_total")]
        return bool(lines) and float(lines[0].split()[-1]) >= 1

    wait_until(counted, timeout=10)


async def test_queue_concurrency_holds_over_shared_jobs_across_two_dispatchers(
    cluster: Cluster, store: JobStore
) -> None:
    await QueueStore(store.db).set_limits("llm", {"concurrency": 3})
    a = cluster.dispatcher(**SHARED)
    b = cluster.dispatcher(**SHARED)
    ids = await submit(store, "shared_wait", 24, queue="llm", payload={"seconds": 0.3})
    await wait_all_terminal(store, 24, timeout=60)
    docs = [d async for d in store.db["jobs"].find({"_id": {"$in": ids}})]
    assert all(d["status"] == "completed" for d in docs)
    assert max_overlap(runs(docs)) == 3  # by the server's own timestamps: never more
    assert all(d["history"][-1].get("shared") is True for d in docs)
    await assert_clean(store, ids, a, b)


async def test_sigterm_with_200_shared_jobs_in_flight_hands_every_one_back(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(
        **SHARED, BROOK_SHUTDOWN_GRACE_SECONDS="1", BROOK_SHARED_PROCESSES="2"
    )
    ids = await submit(store, "shared_wait", 200, payload={"seconds": 60})
    wait_started(disp, ids)
    assert disp.stop(timeout=15) == 0
    jobs = [await store.get(i) for i in ids]
    assert all(j.status == "pending" and j.attempts == 0 for j in jobs)
    released = [h for j in jobs for h in j.history if h.get("reason") == "released"]
    assert len(released) == 200 and all(h.get("shared") is True for h in released)
    assert len(disp.events("job.released")) == 200


async def test_a_shared_job_that_does_not_yield_to_its_stop_has_its_process_killed(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**SHARED, BROOK_SHARED_STOP_GRACE_SECONDS="0.5")
    neighbours = await submit(store, "shared_wait", 5, payload={"seconds": 60, "later": 0.05})
    wait_started(disp, neighbours)
    [stuck] = await submit(
        store, "shared_block", payload={"seconds": 5}, timeout_s=0.3, max_attempts=1
    )
    await wait_all_terminal(store, 6, timeout=30)
    job = await store.get(stuck)
    assert job.status == "failed" and job.error is not None and job.error["type"] == "Timeout"
    [killed] = disp.events("worker.killed")
    assert killed["reason"] == "timeout" and killed["job_id"] == stuck
    assert sorted(killed["job_ids"]) == sorted([*neighbours, stuck])
    for job_id in neighbours:  # each neighbour: a crash, retried, not charged, done once
        n = await store.get(job_id)
        assert n.status == "completed" and n.attempts == 2 and n.max_attempts == 4
        assert n.error is None
    assert sorted(await effects_by_job(store)) == sorted(neighbours)
    await assert_clean(store, [*neighbours, stuck], disp)


async def test_a_job_that_killed_its_shared_process_twice_runs_next_in_a_process_of_its_own(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**SHARED)
    [job_id] = await submit(store, "shared_crash", payload={"times": 2})
    await wait_all_terminal(store, 1, timeout=30)
    job = await store.get(job_id)
    assert job.status == "completed" and job.result == 3
    ends = [h for h in job.history if h.get("attempt") and h["status"] != "running"]
    assert [(h["attempt"], h.get("error"), h.get("shared")) for h in ends] == [
        (1, "WorkerCrashed", True),
        (2, "WorkerCrashed", True),
        (3, None, None),  # alone: not shared
    ]
    assert job.max_attempts == 5  # the two shared deaths were not charged
    workers = [e["worker"] for e in disp.events("task.started") if e.get("job_id") == job_id]
    assert workers[:2] != [] and workers[2].startswith("w") and workers[0].startswith("s")
    await assert_clean(store, [job_id], disp)


async def test_a_shared_process_is_replaced_after_its_recycle_count_once_drained(
    cluster: Cluster, store: JobStore
) -> None:
    port = free_port()
    disp = cluster.dispatcher(**SHARED, BROOK_SHARED_RECYCLE="5", BROOK_METRICS_PORT=str(port))
    ids = await submit(store, "shared_wait", 12, payload={"seconds": 0.05})
    await wait_all_terminal(store, 12, timeout=30)
    assert [(await store.get(i)).status for i in ids] == ["completed"] * 12
    recycled = disp.events("worker.recycled")
    assert len(recycled) >= 2 and all(r["jobs"] == 5 for r in recycled)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    gauges = [x for x in text.splitlines() if x.startswith("brook_shared_jobs_in_flight{")]
    assert gauges and all(float(g.split()[-1]) == 0 for g in gauges)  # drained: none in flight
    await assert_clean(store, ids, disp)


async def test_a_shared_process_past_its_memory_ceiling_finishes_its_jobs_then_is_replaced(
    cluster: Cluster, store: JobStore
) -> None:
    """A job leaks 256 MiB into its shared process (ceiling 192 MiB) while three others run
    there: none of them is stopped, new jobs go to a new process, and the old one is stopped
    once they are done."""
    disp = cluster.dispatcher(**SHARED, BROOK_SHARED_MEMORY_MIB="192")
    waiting = await submit(store, "shared_wait", 3, payload={"seconds": 2})
    first = wait_started(disp, waiting)
    [leak] = await submit(store, "shared_leak", payload={"mib": 256})
    await wait_until_status(store, leak, "completed")
    leaked = (await store.get(leak)).result
    assert set(first.values()) == {leaked}  # all four in one process
    after = await submit(store, "shared_wait", 5, payload={"seconds": 0.05})
    await wait_all_terminal(store, 9, timeout=60)
    for job_id in [*waiting, leak, *after]:
        job = await store.get(job_id)
        assert (job.status, job.attempts) == ("completed", 1), job_id  # none stopped for it
    later = started(disp, after)
    assert leaked not in later.values()  # new jobs went to its replacement
    [recycled] = disp.events("worker.recycled")
    assert (recycled["pid"], recycled["reason"], recycled["jobs"]) == (leaked, "memory", 4)
    assert recycled["rss_mib"] >= 192 and recycled["ceiling_mib"] == 192
    wait_until(lambda: not pid_alive(leaked), timeout=30)
    await assert_clean(store, [*waiting, leak, *after], disp)


async def test_shared_jobs_each_commit_their_own_transaction_with_progress_and_a_child(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**SHARED)
    # Created first: transactions that each create it on their first insert conflict.
    await store.db.create_collection("orders")
    ids = await submit(store, "shared_order", 20)
    await wait_all_terminal(store, 40, timeout=60)  # and their 20 follow-ups
    for job_id in ids:
        job = await store.get(job_id)
        assert job.status == "completed" and job.result == {"job": job_id}, job.history
        assert job.attempts == 1  # each transaction, open beside 19 others, committed
        [done] = [h for h in job.history if h["status"] == "completed"]
        assert done.get("transaction") is True and done.get("shared") is True
        assert job.progress is not None and job.progress["fraction"] == 0.5
        assert await store.db["orders"].count_documents({"job_id": job_id}) == 1
        [child] = await store.jobs.find({"payload.after": job_id}).to_list()
        assert child["status"] == "completed"
    assert not disp.events("progress.discarded")
    children = [str(d["_id"]) for d in await store.jobs.find({"task": "noop"}).to_list()]
    await assert_clean(store, [*ids, *children], disp)


async def test_shared_jobs_sleep_and_wait_for_signals_without_holding_a_seat(
    cluster: Cluster, store: JobStore, settings: Settings
) -> None:
    disp = cluster.dispatcher(**SHARED)
    ids = [(await submit(store, "shared_sleeper", payload={"key": f"k{n}"}))[0] for n in range(5)]

    async def all_waiting() -> bool:
        jobs = [await store.get(i) for i in ids]
        return all((j.waiting_for or {}).get("kind") == "signal" for j in jobs)

    deadline = time.monotonic() + 30
    while not await all_waiting():
        assert time.monotonic() < deadline, "not every job waits for its signal"
        await asyncio.sleep(0.1)
    async with AsyncClient(settings.mongo_uri, settings.db) as client:
        for n in range(5):
            assert await client.signal(f"k{n}", {"n": n}) == 1
    await wait_all_terminal(store, 5, timeout=30)
    for n, job_id in enumerate(ids):
        job = await store.get(job_id)
        assert job.status == "completed" and job.result == {"signal": {"n": n}}
        reasons = [(h.get("reason"), h.get("shared")) for h in job.history if h.get("reason")]
        assert reasons == [("sleep", True), ("signal", True)]
    await assert_clean(store, ids, disp)
