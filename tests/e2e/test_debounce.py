"""Debounce through the HTTP API, with two API processes: 100 concurrent submits of one key
(half through each) become one job, every answer names it, and it runs once, with the
latest payload, after the submits went quiet."""

from __future__ import annotations

import asyncio
from datetime import datetime

import httpx

from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster, free_port, wait_terminal
from tests.support.http import TLS
from tests.support.procs import wait_until


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1, verify=TLS).status_code == 200
    except httpx.HTTPError:
        return False


async def test_a_hundred_concurrent_submits_through_two_apis_make_one_job_that_runs_once(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api()
    other = f"http://127.0.0.1:{free_port()}"
    cluster.start("api", BROOK_API_PORT=other.rsplit(":", 1)[1])
    wait_until(lambda: healthy(other), timeout=30)
    disp = cluster.dispatcher()
    urls = [cluster.api_url, other]

    async def submit(client: httpx.AsyncClient, i: int) -> httpx.Response:
        body = {"task": "echo", "payload": {"n": i}, "debounce_key": "doc-7", "debounce_s": 1.5}
        return await client.post(f"{urls[i % 2]}/jobs", json=body)

    async with httpx.AsyncClient(timeout=30) as client:
        answers = await asyncio.gather(*(submit(client, i) for i in range(100)))
    assert all(a.status_code in (200, 202) for a in answers), [a.text for a in answers]
    assert sorted(a.status_code for a in answers).count(202) == 1  # one started it
    ids = {a.json()["id"] for a in answers}
    assert len(ids) == 1  # every answer names the job it joined
    [job_id] = ids
    assert await store.jobs.count_documents({"debounce_key": "doc-7"}) == 1
    job = wait_terminal(http, job_id, timeout=60)
    assert job["status"] == "completed" and job["attempts"] == 1
    assert job["debounced"] == 100
    # The latest payload: that of the answer that saw all 100 submits.
    [last] = [a.json() for a in answers if a.json()["debounced"] == 100]
    assert job["result"] == last["payload"] == job["payload"]
    # It waited for the submits to go quiet: due 1.5 s after the last one, not before.
    assert when(job["started_at"]) >= when(last["run_at"])
    # Logged once the completion write is back: the API may show the job completed first.
    wait_until(lambda: [e for e in disp.events("job.completed") if e["job_id"] == job_id])
    assert len(disp.events("task.started")) == 1
    # A submit after it ran starts a new job.
    fresh = http.post("/jobs", json={"task": "noop", "debounce_key": "doc-7", "debounce_s": 0.1})
    assert fresh.status_code == 202 and fresh.json()["id"] != job_id
