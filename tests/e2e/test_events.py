"""Live job events over SSE against real `brook api` / `brook dispatcher` processes."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from brook.common.domain.models import JobSpec
from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster, free_port
from tests.support.procs import BrookProcess, wait_until
from tests.support.sse import Ev, Reader, by_job, read_events

LIVE = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.progress", "BROOK_SSE_PING_SECONDS": "0.5"}


def api(cluster: Cluster, **env: str) -> BrookProcess:
    return cluster.api(**LIVE, **env)


def dispatcher(cluster: Cluster, **env: str) -> BrookProcess:
    return cluster.dispatcher(**LIVE, BROOK_METRICS_PORT=str(free_port()), **env)


def submit(http: httpx.Client, task: str = "noop", n: int = 1, **body: Any) -> list[str]:
    ids = []
    for _ in range(n):
        resp = http.post("/jobs", json={"task": task, **body})
        assert resp.status_code == 202, resp.text
        ids.append(resp.json()["id"])
    return ids


def three_each(ids: list[str]) -> Any:
    """`until` for a stream of `noop` jobs: every one pending, running, completed."""
    return lambda events: all(
        by_job(events).get(i) == ["pending", "running", "completed"] for i in ids
    )


def assert_exactly_once(events: list[Ev], ids: list[str]) -> None:
    """Every job's whole story, each change once, in order; no event twice."""
    assert {i: by_job(events).get(i) for i in ids} == {
        i: ["pending", "running", "completed"] for i in ids
    }
    seen = [e.id for e in events]
    assert len(seen) == len(set(seen))


def test_a_jobs_stream_shows_pending_running_progress_completed_in_order_then_ends(
    cluster: Cluster, http: httpx.Client
) -> None:
    api(cluster)
    dispatcher(cluster)
    # Due a little later, so that the stream (opened next) sees it pending first; a busy
    # machine may take a few seconds to open it.
    soon = (datetime.now(UTC) + timedelta(seconds=4)).isoformat()
    [job_id] = submit(http, "steps", payload={"steps": 3, "seconds": 1.5}, run_at=soon)
    events = read_events(
        f"{cluster.api_url}/jobs/{job_id}/events", params={"include": "result"}, timeout=30
    )
    assert {e.event for e in events} == {"job"}  # and then the server ended the stream
    statuses = [e.status for e in events]
    assert statuses[0] == "pending" and statuses[-1] == "completed"
    assert set(statuses[1:-1]) == {"running"} and len(statuses) >= 5
    progress: list[Any] = [e.data.get("progress") for e in events]
    assert progress[:2] == [None, None]  # submitted; claimed
    assert events[1].data["started_at"] is None  # a claim is a lease, not a start
    # A task that runs longer than 0.5 s gets its start written while it runs: that event
    # may come before its first progress report.
    marks = [e for e in events[2:] if e.data.get("progress") is None]
    assert len(marks) <= 1 and all(e.data["started_at"] is not None for e in marks)
    fractions = [p["fraction"] for p in progress[2:] if p is not None]
    assert fractions == sorted(fractions) and {1 / 3, 2 / 3, 1.0} <= set(fractions)
    assert progress[-1]["message"] == "attempt 1 step 3/3"
    assert events[-1].data["result"] == 3
    # Resuming after the last event: nothing more, and say so (204 stops EventSource retrying).
    again = httpx.get(
        f"{cluster.api_url}/jobs/{job_id}/events", headers={"Last-Event-ID": events[-1].id}
    )
    assert again.status_code == 204
    # A finished job's stream is its state, then the end.
    [done] = read_events(f"{cluster.api_url}/jobs/{job_id}/events", timeout=10)
    assert done.status == "completed"


def test_a_client_cut_off_mid_stream_resumes_with_exactly_the_missing_events(
    cluster: Cluster, http: httpx.Client
) -> None:
    api(cluster)
    whole = Reader(f"{cluster.api_url}/events", timeout=60)  # the reference: never cut
    cut = Reader(f"{cluster.api_url}/events", timeout=60)
    assert whole.connected.wait(10) and cut.connected.wait(10)
    ids = submit(http, "noop", 3)
    wait_until(lambda: len(cut.events) >= 2, timeout=10)
    before = cut.stop()
    dispatcher(cluster)  # everything runs while the cut client is away
    ids += submit(http, "noop", 2)
    resumed = read_events(
        f"{cluster.api_url}/events",
        last_id=before[-1].id,
        until=lambda ev: three_each(ids)(before + ev),
        timeout=30,
    )
    wait_until(lambda: three_each(ids)(whole.events), timeout=30)
    reference = whole.stop()
    assert [(e.id, e.data) for e in before + resumed] == [(e.id, e.data) for e in reference]
    assert_exactly_once(reference, ids)


async def test_resuming_works_across_an_api_restart(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    first_api = api(cluster)
    dispatcher(cluster)
    reader = Reader(f"{cluster.api_url}/events", timeout=60)
    assert reader.connected.wait(10)
    ids = submit(http, "noop", 3)
    wait_until(lambda: len(reader.events) >= 4, timeout=20)
    first_api.signal(signal.SIGKILL)
    before = reader.stop()
    # While no API runs, more jobs come and go (submitted straight to the store).
    more = await _submit_direct(store, 3)
    second_api = api(cluster)
    after = read_events(
        f"{cluster.api_url}/events",
        last_id=before[-1].id,
        until=lambda ev: three_each(ids + more)(before + ev),
        timeout=30,
    )
    assert_exactly_once(before + after, ids + more)
    assert second_api.pid != first_api.pid


async def _submit_direct(store: JobStore, n: int) -> list[str]:
    return [(await store.submit(JobSpec(task="noop", payload={}))).job.id for _ in range(n)]


def test_resuming_works_across_a_primary_step_down(
    cluster: Cluster, http: httpx.Client, mongo: Any
) -> None:
    rs = mongo.replset
    assert rs is not None, "needs the embedded replica set"
    api(cluster)
    dispatcher(cluster)
    through = Reader(f"{cluster.api_url}/events", timeout=120)  # stays connected throughout
    cut = Reader(f"{cluster.api_url}/events", timeout=120)
    assert through.connected.wait(10) and cut.connected.wait(10)
    ids = submit(http, "noop", 3)
    wait_until(lambda: three_each(ids)(cut.events), timeout=20)
    before = cut.stop()
    old = rs.primary_index()
    direct: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{rs.ports[old]}/?directConnection=true"
    )
    with contextlib.suppress(PyMongoError):  # the stepping-down primary hangs up
        direct.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
    direct.close()
    wait_until(lambda: rs.primary_index() not in (None, old), timeout=60, interval=0.2)
    more: list[str] = []

    def submitted() -> bool:
        try:
            more.extend(submit(http, "noop", 3 - len(more)))
        except AssertionError:  # a 503 while the new primary settles
            time.sleep(0.3)
        return len(more) == 3

    wait_until(submitted, timeout=60)
    after = read_events(
        f"{cluster.api_url}/events",
        last_id=before[-1].id,
        until=three_each(more),
        timeout=60,
    )
    assert_exactly_once(before + after, ids + more)
    wait_until(lambda: three_each(ids + more)(through.events), timeout=60)
    assert_exactly_once(through.stop(), ids + more)


def test_the_events_stream_filters_by_task_and_status(cluster: Cluster, http: httpx.Client) -> None:
    api(cluster)
    reader = Reader(
        f"{cluster.api_url}/events", params={"task": "echo", "status": "completed"}, timeout=60
    )
    everything = Reader(f"{cluster.api_url}/events", params={"queue": "default"}, timeout=60)
    nothing = Reader(f"{cluster.api_url}/events", params={"queue": "elsewhere"}, timeout=60)
    for r in (reader, everything, nothing):
        assert r.connected.wait(10)
    dispatcher(cluster)
    [echo] = submit(http, "echo", payload={"a": 1})
    [noop] = submit(http, "noop")
    wait_until(lambda: three_each([echo, noop])(everything.events), timeout=30)
    wait_until(lambda: reader.events, timeout=10)
    assert [(e.data["id"], e.status) for e in reader.stop()] == [(echo, "completed")]
    assert nothing.stop() == []
    everything.stop()


def test_event_streams_need_the_token_like_every_other_endpoint(
    cluster: Cluster, http: httpx.Client
) -> None:
    api(cluster, BROOK_API_TOKEN="s3cret")
    assert httpx.get(f"{cluster.api_url}/events").status_code == 401
    assert httpx.get(f"{cluster.api_url}/jobs/x/events").status_code == 401
    auth = {"Authorization": "Bearer s3cret"}
    [job_id] = [
        httpx.post(f"{cluster.api_url}/jobs", json={"task": "noop"}, headers=auth).json()["id"]
    ]
    [current] = read_events(
        f"{cluster.api_url}/jobs/{job_id}/events", headers=auth, until=lambda ev: True
    )
    assert current.status == "pending"
    # An id this deployment did not issue resumes nothing: `reset` (unknown_id), then the
    # stream afresh (a job's begins with its current state).
    reset, fresh = read_events(
        f"{cluster.api_url}/jobs/{job_id}/events",
        headers=auth,
        last_id="not-an-id",
        until=lambda evs: len(evs) == 2,
    )
    assert reset.event == "reset" and reset.data["reason"] == "unknown_id", reset
    assert reset.data["since"] is None and fresh.status == "pending"
    assert httpx.get(f"{cluster.api_url}/jobs/nope/events", headers=auth).status_code == 404


def test_an_api_whose_event_hub_crashes_stops_loudly(cluster: Cluster) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.crashing_api"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert '"background.crashed"' in out.stdout and "a bug in the hub" in out.stdout
