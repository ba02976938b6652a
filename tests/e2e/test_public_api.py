"""The one public import, end to end: a task module that imports only `task`, `schedule`
and `Client` from `brook` is loaded by a real `brook api` and `brook dispatcher` (and by
each worker process), and its jobs, a follow-up submitted with `Client` from inside a task,
and its schedule's jobs all complete."""

from __future__ import annotations

from typing import Any

import httpx

from tests.e2e.conftest import Cluster, wait_terminal
from tests.support.procs import wait_until

# No metrics server: its port may be taken on a shared host, which logs an error.
PUBLIC = {"BROOK_TASKS": "tests.tasks.public_api", "BROOK_METRICS_PORT": "0"}


def submit(http: httpx.Client, task: str, payload: dict[str, Any]) -> str:
    resp = http.post("/jobs", json={"task": task, "payload": payload})
    assert resp.status_code == 202, resp.text
    job_id: str = resp.json()["id"]
    return job_id


def test_a_task_module_importing_only_from_brook_runs_under_a_real_dispatcher(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(**PUBLIC)
    dispatcher = cluster.dispatcher(**PUBLIC)

    job = wait_terminal(http, submit(http, "public_add", {"a": 2, "b": 3}))
    assert (job["status"], job["result"]) == ("completed", 5), job

    relay = wait_terminal(http, submit(http, "public_relay", {"a": 40}))
    assert relay["status"] == "completed", relay
    child = wait_terminal(http, relay["result"])
    assert (child["task"], child["status"], child["result"]) == ("public_add", "completed", 41)

    def scheduled_job_id() -> str | None:
        schedules = http.get("/schedules").json()["schedules"]
        ours = [s for s in schedules if s["name"] == "public-every-second"]
        assert ours and ours[0]["task"] == "public_add", schedules
        last: str | None = ours[0]["last_job_id"]
        return last

    tick = wait_terminal(http, wait_until(scheduled_job_id, timeout=30))
    assert (tick["status"], tick["result"]) == ("completed", 3), tick
    assert tick["schedule"]["name"] == "public-every-second"
    assert not [e for e in dispatcher.logs() if e.get("level") == "error"]
