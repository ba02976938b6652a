"""Rerun from a step on real processes: a job that failed at its fourth step, rerun from
its third over HTTP and the CLI, runs steps three to five only (told by their effect rows)
and keeps the first two with their output; what may not be rerun gets a clear 422."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from pymongo import MongoClient

from brook import Client
from brook.common.runtime.settings import Settings
from tests.e2e.conftest import Cluster

DURABLE = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.durable"}


def finished(http: httpx.Client, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = http.get(f"/jobs/{job_id}").json()
        if job["status"] in ("completed", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, f"job still {job['status']}: {job}"
        time.sleep(0.1)


def effects(settings: Settings, job_id: str) -> list[tuple[int, int]]:
    """The effect rows of a job: (step, attempt), in step order."""
    mongo: MongoClient[dict[str, Any]] = MongoClient(settings.mongo_uri)
    with mongo:
        rows = mongo[settings.db]["effects"].find({"job_id": job_id})
        return sorted((r["step"], r["attempt"]) for r in rows)


def failed_at_step_four(http: httpx.Client) -> dict[str, Any]:
    spec = {"task": "paid_steps", "payload": {"fail_at": 4}, "max_attempts": 1}
    spec["idempotency_key"] = f"paid-{time.monotonic_ns()}"
    job = finished(http, http.post("/jobs", json=spec).json()["id"])
    assert job["status"] == "failed" and job["error"]["step"] == "step-4", job
    return job


def test_a_rerun_from_step_three_runs_steps_three_to_five_only(
    cluster: Cluster, http: httpx.Client, settings: Settings
) -> None:
    api = cluster.api(**DURABLE)
    cluster.dispatcher(**DURABLE)
    source = failed_at_step_four(http)
    assert effects(settings, source["id"]) == [(1, 1), (2, 1), (3, 1), (4, 1)]
    answer = http.post(
        f"/jobs/{source['id']}/rerun", json={"from_step": "step-3", "payload": {"fail_at": None}}
    )
    assert answer.status_code == 202, answer.text
    made = answer.json()
    assert answer.headers["location"] == f"/jobs/{made['id']}"
    assert made["rerun_of"] == source["id"] and made["idempotency_key"] is None
    assert (made["task"], made["payload"], made["max_attempts"]) == ("paid_steps", {"fail_at": None}, 1)
    rerun = finished(http, made["id"])
    assert rerun["status"] == "completed" and rerun["result"] == [1, 2, 3, 4, 5], rerun
    # Steps one and two were carried, not run: only three to five left effect rows.
    assert effects(settings, rerun["id"]) == [(3, 1), (4, 1), (5, 1)]
    assert [(s["name"], s["attempt"]) for s in rerun["steps"]] == [
        ("step-1", 0),
        ("step-2", 0),
        ("step-3", 1),
        ("step-4", 1),
        ("step-5", 1),
    ]
    # The carried steps' output came with them, before the new attempt's.
    text = http.get(f"/jobs/{rerun['id']}/output", params={"format": "text"}).text
    assert text == "".join(f"step {n}\n" for n in range(1, 6)), text
    assert http.get(f"/jobs/{source['id']}").json()["reruns"] == [rerun["id"]]
    [logged] = api.events("job.rerun")
    assert (logged["job_id"], logged["rerun_of"], logged["from_step"]) == (
        rerun["id"],
        source["id"],
        "step-3",
    )
    assert logged["carried"] == 2 and logged["by"] == "none"
    # The CLI and the Python client make reruns the same way, from any recorded step or
    # the step the job failed in (which carries every recorded step).
    out = cluster.cli("rerun", source["id"], "--from-step", "step-4", "--payload", "{}")
    assert out.returncode == 0, out.stderr
    by_cli = json.loads(out.stdout)
    with Client(settings.mongo_uri, settings.db) as client:
        by_python = client.rerun(source["id"], "step-2", payload={})
        done = [client.wait(j, timeout=60) for j in (by_cli["id"], by_python.id)]
    assert [j.status for j in done] == ["completed", "completed"]
    assert effects(settings, by_cli["id"]) == [(4, 1), (5, 1)]
    assert effects(settings, by_python.id) == [(2, 1), (3, 1), (4, 1), (5, 1)]
    shown = http.get(f"/jobs/{source['id']}").json()
    assert shown["reruns"] == [rerun["id"], by_cli["id"], by_python.id]
    assert effects(settings, source["id"]) == [(1, 1), (2, 1), (3, 1), (4, 1)]  # untouched


def test_what_may_not_be_rerun_gets_a_clear_422_and_nothing_is_made(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(**DURABLE)
    cluster.dispatcher(**DURABLE)
    source = failed_at_step_four(http)
    count = len(http.get("/jobs").json()["jobs"])

    def refused(job_id: str, body: object) -> str:
        answer = http.post(f"/jobs/{job_id}/rerun", json=body)
        assert answer.status_code == 422, answer.text
        return json.dumps(answer.json()["detail"])

    assert (
        "no recorded step 'step-9'; its steps: 'step-1', 'step-2', 'step-3', and 'step-4', "
        "the step it failed in"
    ) in refused(source["id"], {"from_step": "step-9"})
    plain = finished(http, http.post("/jobs", json={"task": "noop"}).json()["id"])
    assert "recorded no steps" in refused(plain["id"], {"from_step": "step-1"})
    later = http.post("/jobs", json={"task": "paid_steps", "delay": 3600}).json()
    pending = http.post(f"/jobs/{later['id']}/rerun", json={"from_step": "step-1"})
    assert pending.status_code == 409, pending.text  # its state, not the request, is wrong
    assert "is pending: only a finished job" in pending.json()["detail"]
    assert "from_step" in refused(source["id"], {})
    assert "starts with '$'" in refused(source["id"], {"from_step": "step-1", "payload": {"$x": 1}})
    assert "extra_forbidden" in refused(source["id"], {"from_step": "step-1", "extra": 1})
    assert http.post("/jobs/nope/rerun", json={"from_step": "step-1"}).status_code == 404
    assert len(http.get("/jobs").json()["jobs"]) == count + 2  # the noop and the delayed job only
    assert http.get(f"/jobs/{source['id']}").json()["reruns"] == []
    out = cluster.cli("rerun", source["id"], "--from-step", "step-9")
    assert out.returncode == 1 and "422" in out.stderr and "step-9" in out.stderr
