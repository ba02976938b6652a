"""Bulk retry and cancel with real processes: `brook retry` by error type after a batch of
failures (a dry run, the retry, a resend that changes nothing), and `POST /jobs/cancel` of
one tenant's jobs, over HTTP, and a cancel of 5,000 pending jobs racing the dispatcher that
claims and finishes them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx

from brook.common.domain.models import JobSpec
from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster
from tests.e2e.test_faults import wait_all_terminal
from tests.support.procs import wait_until


async def test_brook_retry_by_error_type_after_a_batch_of_failures(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api()
    disp = cluster.dispatcher()
    since = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    specs = [{"task": "fail", "max_attempts": 1} for _ in range(6)]
    specs += [{"task": "crash", "max_attempts": 1} for _ in range(2)]
    ids = [j["id"] for j in http.post("/jobs/batch", json={"jobs": specs}).json()["jobs"]]
    await wait_all_terminal(store, len(ids), timeout=90)
    [kind] = {(await store.get(i)).error["type"] for i in ids[:6]}  # type: ignore[index]
    until = datetime.now(UTC).isoformat()  # the failures of this batch, not those after
    args = ["retry", "--status", "failed", "--error-type", kind, "--since", since]
    args += ["--until", until]
    dry = cluster.cli(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == {"count": 6}
    done = cluster.cli(*args)
    assert done.returncode == 0 and json.loads(done.stdout) == {"count": 6}, done.stderr
    # Each ran again (a second attempt) and failed again; the crashes were left alone.
    wait_until(lambda: len(disp.events("job.failed")) >= 14, timeout=90)
    for job_id in ids[:6]:
        job = await store.get(job_id)
        assert job.status == "failed" and job.attempts == 2
    for job_id in ids[6:]:
        assert (await store.get(job_id)).attempts == 1
    # The same request again: the failures it named were retried; nothing more changes.
    again = cluster.cli(*args)
    assert json.loads(again.stdout) == {"count": 0}
    # Without the upper bound, the second failures match.
    assert json.loads(cluster.cli(*args[:-2], "--dry-run").stdout) == {"count": 6}
    bad = cluster.cli("retry")
    assert bad.returncode == 2 and "filter" in bad.stderr


async def test_post_jobs_cancel_cancels_one_tenants_jobs_and_a_resend_changes_nothing(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api()  # no dispatcher: the jobs stay pending
    acme = [{"task": "noop", "key": "acme"} for _ in range(30)]
    other = [{"task": "noop", "key": "globex"} for _ in range(5)]
    http.post("/jobs/batch", json={"jobs": acme + other})
    body = {"key": "acme", "status": "pending"}
    none = {"spawned_cancelled": 0}  # they spawned no jobs
    assert http.post("/jobs/cancel", json={**body, "dry_run": True}).json() == {"count": 30, **none}
    assert http.post("/jobs/cancel", json=body).json() == {"count": 30, **none}
    assert http.post("/jobs/cancel", json=body).json() == {"count": 0, **none}
    counts = {
        (d["key"], d["status"]) for d in await store.jobs.find({}, {"key": 1, "status": 1}).to_list()
    }
    assert counts == {("acme", "cancelled"), ("globex", "pending")}
    bad = http.post("/jobs/cancel", json={"dry_run": True})
    assert bad.status_code == 422
    assert http.post("/jobs/retry", json={"status": "nope"}).status_code == 422


async def test_a_bulk_cancel_racing_a_dispatcher_cancels_or_leaves_each_job_never_both(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    """Between a page's read and its write the dispatcher claims and finishes jobs of that
    page: the write's fence (waiting or pending) lets only the jobs still waiting be
    cancelled; a running one is asked to stop; a finished one is left as it is."""
    n = 5000
    for _ in range(n // 1000):
        await store.submit_many([JobSpec(task="noop", payload={}) for _ in range(1000)])
    cluster.api()
    disp = cluster.dispatcher(BROOK_CONCURRENCY="4")
    wait_until(lambda: len(disp.events("job.completed")) >= 200, timeout=60)
    answer = http.post("/jobs/cancel", json={"task": "noop"}, timeout=120)
    assert answer.status_code == 200, answer.text
    count = answer.json()["count"]
    await wait_all_terminal(store, n, timeout=120)
    docs = await store.jobs.find(
        {}, {"status": 1, "history": 1, "cancel_requested": 1, "bulk_op": 1}
    ).to_list()
    by_status: dict[str, set[str]] = {}
    for d in docs:
        by_status.setdefault(d["status"], set()).add(d["_id"])
    assert set(by_status) == {"completed", "cancelled"}, {k: len(v) for k, v in by_status.items()}
    both = [
        d["_id"] for d in docs if {"completed", "cancelled"} <= {h["status"] for h in d["history"]}
    ]
    assert both == []
    # A cancelled job that had started was asked to stop first, never cancelled under its
    # worker; every job the dispatcher finished is completed, once, and none is cancelled.
    cut = [
        d["_id"]
        for d in docs
        if d["status"] == "cancelled"
        and "running" in {h["status"] for h in d["history"]}
        and not d.get("cancel_requested")
    ]
    assert cut == []
    # A log line follows its acknowledged write: the last ones are waited for.
    wait_until(lambda: len(disp.events("job.completed")) >= len(by_status["completed"]), 10)
    finished = [e["job_id"] for e in disp.events("job.completed")]
    assert sorted(finished) == sorted(by_status["completed"])
    # The count is what the action changed: the jobs it cancelled and those it asked to stop.
    assert count == sum(1 for d in docs if d.get("bulk_op")) > 0
    assert {d["_id"] for d in docs if d["status"] == "cancelled"} <= {
        d["_id"] for d in docs if d.get("bulk_op")
    }
    again = http.post("/jobs/cancel", json={"task": "noop"}, timeout=120)
    assert again.json() == {"count": 0, "spawned_cancelled": 0}
    after = {d["_id"]: d["status"] for d in await store.jobs.find({}, {"status": 1}).to_list()}
    assert after == {d["_id"]: d["status"] for d in docs}
