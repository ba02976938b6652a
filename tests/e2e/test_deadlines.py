"""Deadlines on real processes, every dispatcher with a sweep of 300 s (so that no end here
can be the sweep's): a job whose `start_by` passed never starts, whether it passed before
its claim, while it waited behind a full worker, or while it sat claimed ahead in a
dispatcher's buffer; a job reaches its `deadline` retrying, running (in a process of its
own, or shared, or by its task's default), sleeping durably, waiting for a signal or for
its parents, and ends `failed` with `DeadlineExceeded`, never retried; the CLI submits bounds, shows them (`ls`, `status`) and
a bad one is refused, storing nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.e2e.conftest import Cluster, wait_terminal
from tests.support.procs import BrookProcess, wait_until

PLAIN = "tests.tasks.basic,tests.tasks.durable,tests.tasks.deadlines"
TASKS = f"{PLAIN},tests.tasks.shared"
SLOW_SWEEP = {"BROOK_TASKS": TASKS, "BROOK_SWEEP_SECONDS": "300"}


def submit(http: httpx.Client, task: str, payload: dict[str, Any], **spec: Any) -> str:
    answer = http.post("/jobs", json={"task": task, "payload": payload, **spec})
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    return job_id


def suspended(http: httpx.Client, job_id: str) -> bool:
    """The job's run ended to sleep or wait for a signal: it waits without a worker."""
    return http.get(f"/jobs/{job_id}").json()["waiting_for"] is not None


def started(proc: BrookProcess, job_id: str) -> bool:
    return any(e.get("job_id") == job_id for e in proc.events("task.started"))


async def test_a_job_past_its_start_by_never_starts_before_a_claim_behind_a_full_worker_or_claimed_ahead(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    # No shared tasks: one worker, busy, beside free shared seats makes a claim look dry
    # until the next sweep (a claimer matter of its own).
    disp = cluster.dispatcher(
        **{**SLOW_SWEEP, "BROOK_TASKS": PLAIN}, BROOK_CONCURRENCY="1", BROOK_PREFETCH="1"
    )
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    late = submit(http, "noop", {}, start_by=past)
    # Quick tasks first: a dispatcher claims ahead only at a pace it has seen.
    for job_id in [submit(http, "noop", {}) for _ in range(3)]:
        assert wait_terminal(http, job_id)["status"] == "completed"
    blocker = submit(http, "sleep", {"seconds": 8})
    wait_until(lambda: started(disp, blocker), timeout=30)
    ahead = submit(http, "noop", {}, start_within_s=2)  # claimed ahead: the buffer holds one
    disp.wait_for_event("job.claimed", timeout=30, where=lambda e: e.get("job_id") == ahead)
    behind = submit(http, "noop", {}, start_within_s=3)  # the buffer is full: it waits
    for job_id in (late, ahead, behind):
        job = wait_terminal(http, job_id, timeout=30)
        assert job["status"] == "cancelled", job
        assert job["error"]["type"] == "StartByPassed", job
        assert job["started_at"] is None and job["start_by"] is not None
        assert not started(disp, job_id)
    assert http.get(f"/jobs/{blocker}").json()["status"] == "running"  # all ended before it
    lines = [e for e in disp.events("job.cancelled") if e.get("error_type") == "StartByPassed"]
    assert sorted(e["job_id"] for e in lines) == sorted({late, ahead, behind})


async def test_a_job_behind_a_full_queue_ends_at_its_start_by_by_a_dispatcher_timer(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    disp = cluster.dispatcher(**{**SLOW_SWEEP, "BROOK_TASKS": PLAIN}, BROOK_CONCURRENCY="2")
    assert http.put("/queues/narrow", json={"concurrency": 1}).status_code == 200
    blocker = submit(http, "sleep", {"seconds": 8}, queue="narrow")
    wait_until(lambda: started(disp, blocker), timeout=30)
    behind = submit(http, "noop", {}, queue="narrow", start_within_s=2)  # no queue slot
    job = wait_terminal(http, behind, timeout=30)
    assert (job["status"], job["error"]["type"], job["attempts"]) == (
        "cancelled",
        "StartByPassed",
        0,
    )
    assert not started(disp, behind)
    assert http.get(f"/jobs/{blocker}").json()["status"] == "running"  # ended before it
    [line] = [e for e in disp.events("job.cancelled") if e["job_id"] == behind]
    assert line["via"] == "deadline_timer" and line["start_by"] == job["start_by"]


async def test_a_retrying_a_running_a_shared_and_a_sleeping_job_end_at_their_deadline(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    disp = cluster.dispatcher(
        **SLOW_SWEEP,
        BROOK_CONCURRENCY="3",
        BROOK_RETRY_BASE_SECONDS="0.3",
        BROOK_RETRY_CAP_SECONDS="0.5",
    )
    retrying = submit(http, "fail", {"message": "again"}, max_attempts=1000, deadline_s=3)
    running = submit(http, "sleep", {"seconds": 60}, deadline_s=2)
    shared = submit(http, "shared_wait", {"seconds": 60}, deadline_s=2)
    by_default = submit(http, "slow_by_default", {"seconds": 60})
    sleeping = submit(http, "sleeper", {"seconds": 600}, deadline_s=4)
    signalled = submit(http, "waiter", {"key": "never-sent"}, deadline_s=4)
    parent = submit(http, "noop", {}, delay=3600)
    child = submit(http, "noop", {}, depends_on=[parent], deadline_s=3)  # waiting
    wait_until(lambda: suspended(http, sleeping) and suspended(http, signalled), timeout=30)
    held = (retrying, running, shared, by_default, sleeping, signalled)
    ends = {j: wait_terminal(http, j, timeout=30) for j in held}
    for job_id, job in ends.items():
        assert job["status"] == "failed", job
        assert job["error"]["type"] == "DeadlineExceeded", job
        assert job["deadline"] is not None and started(disp, job_id)
        assert job["history"][-1]["status"] == "failed"
    assert 1 < ends[retrying]["attempts"] < 1000  # it retried, and stopped at its deadline
    for job_id in (running, shared, by_default):
        assert ends[job_id]["attempts"] == 1  # stopped, never retried
    default = ends[by_default]
    made = datetime.fromisoformat(default["created_at"])
    assert datetime.fromisoformat(default["deadline"]) == made + timedelta(seconds=2)
    never_ran = wait_terminal(http, child, timeout=30)
    assert never_ran["status"] == "failed" and never_ran["error"]["type"] == "DeadlineExceeded"
    assert never_ran["attempts"] == 0 and not started(disp, child)
    failed = {
        e["job_id"]: e
        for e in disp.events("job.failed")
        if e.get("error_type") == "DeadlineExceeded"
    }
    assert set(failed) == {*ends, child}
    # The jobs that waited without a dispatcher were ended by a dispatcher's timer.
    for job_id in (sleeping, signalled, child):
        assert failed[job_id]["via"] == "deadline_timer", failed[job_id]


async def test_the_cli_submits_with_bounds_and_shows_them_and_a_bad_one_is_refused(
    cluster: Cluster, http: httpx.Client
) -> None:
    api = cluster.api(BROOK_TASKS=TASKS)  # no dispatcher: the job waits, and its bound ends it
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    out = cluster.cli("submit", "noop", "--start-by", past, "--deadline-s", "600")
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["start_by"] is not None and job["deadline"] is not None
    line = cluster.cli("ls").stdout
    assert f"start_by={job['start_by']}" in line and f"deadline={job['deadline']}" in line
    bad = cluster.cli("submit", "noop", "--deadline", past, "--deadline-s", "5")
    assert bad.returncode != 0 and "give deadline or deadline_s, not both" in bad.stderr
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    early = cluster.cli("submit", "noop", "--run-at", later, "--start-by", past)
    assert early.returncode != 0
    assert "run_at is later than start_by: the job could never start" in early.stderr
    assert [j["id"] for j in http.get("/jobs").json()["jobs"]] == [job["id"]]  # none stored
    [told] = api.events("job.submitted")  # its story names its bounds from the start
    assert (told["start_by"], told["deadline"]) == (job["start_by"], job["deadline"])
    disp = cluster.dispatcher(**SLOW_SWEEP)
    ended = wait_terminal(http, job["id"])
    assert (ended["status"], ended["error"]["type"]) == ("cancelled", "StartByPassed")
    assert not started(disp, job["id"])
    shown = json.loads(cluster.cli("status", job["id"]).stdout)
    assert shown["error"]["type"] == "StartByPassed" and shown["start_by"] == job["start_by"]


async def test_each_tick_of_a_schedule_with_bounds_makes_a_job_that_carries_them(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    disp = cluster.dispatcher(BROOK_TASKS=f"{TASKS},tests.tasks.scheduled_deadlines")
    event = disp.wait_for_event(
        "job.submitted", timeout=30, where=lambda e: e.get("schedule") == "tick-bounded"
    )
    job = http.get(f"/jobs/{event['job_id']}").json()
    made = datetime.fromisoformat(job["created_at"])
    assert datetime.fromisoformat(job["start_by"]) == made + timedelta(seconds=30)
    assert datetime.fromisoformat(job["deadline"]) == made + timedelta(seconds=600)
    assert (event["start_by"], event["deadline"]) == (job["start_by"], job["deadline"])
