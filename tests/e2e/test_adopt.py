"""Adopting Brook, end to end with real processes: the Python client against the API, batches,
routing by task and queue, follow-ups from tasks, retry, retention and the CLI."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime
from typing import Any

import httpx
import pytest

from brook import Client, InvalidInput
from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore
from brook.executor import registry
from tests.e2e.conftest import JSON, Cluster, wait_terminal
from tests.support.procs import brook_cli, wait_until


def brook(cluster: Cluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return brook_cli(*args, env=cluster.env(**env), timeout=120)


def nested(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in range(depth - 1):
        doc = {"a": doc}
    return doc


BAD_SPECS: list[dict[str, Any]] = [
    {"task": "nope"},
    {"task": "echo", "payload": {"$where": 1}},
    {"task": "echo", "payload": {"a": [{"$set": 1}]}},
    {"task": "echo", "payload": nested(33)},
    {"task": "echo", "payload": {"big": 2**70}},
    {"task": "echo", "payload": [1, 2]},
    {"task": "echo", "priority": "high"},
    {"task": "echo", "priority": 1.5},
    {"task": "echo", "max_attempts": 0},
    {"task": "echo", "timeout_s": -1},
    {"task": "echo", "run_at": "not a date"},
    {"task": "echo", "run_at": "2026-01-01T00:00:00Z", "delay": 5},
    {"task": "echo", "queue": "no spaces allowed"},
    {"task": "echo", "unique_for_s": 60},
    {"task": "echo", "idempotency_key": ""},
    {"task": "echo", "retention_s": -1},
    {"task": "echo", "depends_on": ["someid"]},
    {"task": ""},
]


def refused_with(spec: Any) -> int:
    """A parent that is no job is not found (404); any other bad spec is invalid (422)."""
    return 404 if isinstance(spec, dict) and spec.get("depends_on") == ["someid"] else 422


async def test_the_client_and_the_api_reject_the_same_inputs_with_the_same_detail(
    cluster: Cluster, http: httpx.Client, store: JobStore, settings: Settings
) -> None:
    # The API and the dispatcher register every task this test process has registered, so
    # "known tasks" lists the same names from both sides.
    modules = {registry.get_task(name).fn.__module__ for name in registry.registered()}
    env = {"BROOK_TASKS": ",".join(sorted(modules - {registry.DEMO_MODULE} | {"tests.tasks.basic"}))}
    cluster.api(**env)
    cluster.dispatcher(**env)
    with Client(settings.mongo_uri, settings.db) as client:
        for spec in BAD_SPECS:
            resp = http.post("/jobs", json=spec)
            assert resp.status_code == refused_with(spec), (spec, resp.text)
            with pytest.raises(InvalidInput) as info:
                client.submit(**spec)
            assert info.value.detail == resp.json()["detail"], spec
        # JSON has no NaN, but Python's parser reads one: both refuse it the same way.
        resp = http.post("/jobs", content=b'{"task": "echo", "payload": {"x": NaN}}', headers=JSON)
        with pytest.raises(InvalidInput) as info:
            client.submit("echo", {"x": float("nan")})
        assert resp.status_code == 422 and info.value.detail == resp.json()["detail"]
        odd: list[Any] = [{"task": "echo", "surprise": 1}, {"payload": {}}, [1, 2]]
        for bad in [*BAD_SPECS, *odd]:
            jobs = [{"task": "noop"}, {"task": "echo"}, bad]
            resp = http.post("/jobs/batch", json={"jobs": jobs})
            assert resp.status_code == refused_with(bad), (bad, resp.text)
            with pytest.raises(InvalidInput) as info:
                client.submit_many(jobs)
            detail = resp.json()["detail"]
            assert info.value.detail == detail, bad
            assert '"jobs", 2' in json.dumps(detail)  # names the bad spec's index
    assert await store.jobs.count_documents({}) == 0  # nothing invalid was stored


async def test_a_batch_of_1000_goes_in_over_http_and_a_bad_one_stores_nothing(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api()
    specs = [{"task": "noop", "payload": {"i": i}, "queue": ("a", "b")[i % 2]} for i in range(1000)]
    resp = http.post("/jobs/batch", json={"jobs": specs})
    assert resp.status_code == 202, resp.text
    jobs = resp.json()["jobs"]
    assert [j["payload"]["i"] for j in jobs] == list(range(1000)) and jobs[1]["queue"] == "b"
    assert await store.jobs.count_documents({}) == 1000
    bad = [*specs[:637], {"task": "noop", "priority": "x"}, *specs[638:]]
    resp = http.post("/jobs/batch", json={"jobs": bad})
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["jobs", 637, "priority"]
    unknown = [*specs[:10], {"task": "nobody_runs_this"}]
    resp = http.post("/jobs/batch", json={"jobs": unknown})
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["jobs", 10, "task"]
    assert http.post("/jobs/batch", json={"jobs": specs + specs[:1]}).status_code == 422
    assert http.post("/jobs/batch", json={"jobs": []}).status_code == 422
    big = {"jobs": [{"task": "noop", "payload": {"pad": "x" * 2000}}] * 1000}
    assert http.post("/jobs/batch", json=big).status_code == 413
    assert await store.jobs.count_documents({}) == 1000  # nothing invalid was stored
    queues = {q["name"]: q for q in http.get("/queues").json()["queues"]}
    assert queues["a"]["counts"]["pending"] == 500 and queues["b"]["counts"]["pending"] == 500
    assert queues["a"]["concurrency"] is None and queues["a"]["paused"] is False
    # A listing carries payloads only when asked (`include`).
    listed = http.get(
        "/jobs", params={"queue": "b", "limit": 3, "include": "payload"}
    ).json()["jobs"]
    assert [j["payload"]["i"] for j in listed] == [999, 997, 995]
    paths = http.get("/openapi.json").json()["paths"]
    batch = paths["/jobs/batch"]["post"]["requestBody"]["content"]["application/json"]
    assert batch["schema"]["properties"]["jobs"]["maxItems"] == 1000
    assert "queue" in batch["schema"]["properties"]["jobs"]["items"]["properties"]
    assert "post" in paths["/jobs/{job_id}/retry"] and "get" in paths["/queues"]
    assert "queue" in {p["name"] for p in paths["/jobs"]["get"]["parameters"]}


async def test_each_dispatcher_runs_only_its_own_tasks_and_a_job_nobody_runs_stays_pending(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api()  # registers the demo tasks and tests.tasks.basic only
    a = cluster.dispatcher(
        BROOK_DEMO_TASKS="0", BROOK_TASKS="tests.tasks.alpha", BROOK_DISPATCHER_NAME="a"
    )
    b = cluster.dispatcher(
        BROOK_DEMO_TASKS="0", BROOK_TASKS="tests.tasks.beta", BROOK_DISPATCHER_NAME="b"
    )
    # The API accepts a task a live dispatcher runs, though it cannot import it itself.
    jobs = [{"task": t, "payload": {"n": i}} for i in range(10) for t in ("alpha", "beta")]
    ids = [j["id"] for j in http.post("/jobs/batch", json={"jobs": jobs}).json()["jobs"]]
    orphan = (await store.submit(JobSpec(task="gamma", payload={}))).job.id
    noop = http.post("/jobs", json={"task": "noop"}).json()["id"]  # no dispatcher runs noop
    for job_id in ids:
        done = wait_terminal(http, job_id)
        assert done["status"] == "completed", done
        claimed_by = {h["owner"].split(":")[0] for h in done["history"] if "owner" in h}
        assert claimed_by == {"a" if done["task"] == "alpha" else "b"}
        assert done["result"] == done["task"]
    time.sleep(2.5)  # a couple of sweeps (BROOK_SWEEP_SECONDS=1) look again
    for job_id in (orphan, noop):
        job = http.get(f"/jobs/{job_id}").json()
        assert job["status"] == "pending" and job["attempts"] == 0 and job["error"] is None
    for proc in (a, b):
        assert not [e for e in proc.logs() if e.get("job_id") in (orphan, noop)]
        assert not proc.events("job.failed")
    started = a.events("dispatcher.started")[0]
    assert started["tasks"] == ["alpha"] and started["queues"] is None


def test_brook_queues_gives_each_queue_its_own_slots_and_leaves_unserved_queues_alone(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api()
    disp = cluster.dispatcher(BROOK_QUEUES="default:1,emails:2", BROOK_CONCURRENCY="9")
    slow = {"task": "sleep", "payload": {"seconds": 1.0}}
    specs = [{**slow, "queue": q} for q in ("default", "emails") for _ in range(4)]
    specs.append({**slow, "queue": "reports"})
    ids = [j["id"] for j in http.post("/jobs/batch", json={"jobs": specs}).json()["jobs"]]
    for job_id in ids[:8]:
        assert wait_terminal(http, job_id)["status"] == "completed"
    jobs = [http.get(f"/jobs/{i}").json() for i in ids[:8]]

    def most_at_once(queue: str) -> int:
        spans = [
            (datetime.fromisoformat(j["started_at"]), datetime.fromisoformat(j["finished_at"]))
            for j in jobs
            if j["queue"] == queue
        ]
        return max(sum(1 for s, f in spans if s <= start < f) for start, _ in spans)

    assert most_at_once("default") == 1 and most_at_once("emails") == 2
    assert http.get(f"/jobs/{ids[8]}").json()["status"] == "pending"  # "reports": unserved
    assert len(disp.events("worker.started")) == 3  # 1 + 2 slots, not BROOK_CONCURRENCY
    counts = {q["name"]: q["counts"] for q in http.get("/queues").json()["queues"]}
    assert counts["reports"]["pending"] == 1 and counts["emails"]["completed"] == 4


def test_a_task_submits_follow_ups_through_its_own_process_client(
    cluster: Cluster, http: httpx.Client
) -> None:
    env = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.follow_up"}
    cluster.api(**env)
    disp = cluster.dispatcher(**env)
    parents = [
        http.post("/jobs", json={"task": task, "payload": {"queue": "default"}}).json()["id"]
        for task in ("spawn_async", "spawn_sync")
    ]
    for parent in parents:
        done = wait_terminal(http, parent)
        assert done["status"] == "completed", done
        child = wait_terminal(http, done["result"]["child"])
        assert child["status"] == "completed" and child["result"] == {"parent": parent}
    assert wait_terminal(http, parents[1])["result"]["same"] is True
    submitted = [e for e in disp.events("job.submitted") if e["task"] == "echo"]
    assert len(submitted) == 2 and {e["role"] for e in submitted} == {"worker"}
    refused = http.post("/jobs", json={"task": "spawn_unknown", "max_attempts": 1}).json()
    done = wait_terminal(http, refused["id"])
    assert done["status"] == "failed" and done["error"]["type"] == "InvalidInput"
    assert "unknown task 'no_such_task'" in done["error"]["message"]


def test_a_failed_job_is_retried_over_http_with_a_renewed_budget(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api()
    cluster.dispatcher()
    job = http.post("/jobs", json={"task": "fail", "max_attempts": 2}).json()
    assert wait_terminal(http, job["id"])["status"] == "failed"
    resp = http.post(f"/jobs/{job['id']}/retry")
    assert resp.status_code == 200 and resp.json()["max_attempts"] == 4
    done = wait_terminal(http, job["id"])
    assert done["status"] == "failed" and done["attempts"] == 4
    statuses = [h["status"] for h in done["history"]]
    assert statuses.count("failed") == 2 and statuses[0] == "pending"
    ok = http.post("/jobs", json={"task": "noop"}).json()
    wait_terminal(http, ok["id"])
    assert http.post(f"/jobs/{ok['id']}/retry").status_code == 409
    assert http.post("/jobs/nope/retry").status_code == 404


def test_finished_jobs_go_after_the_retention_and_active_ones_stay(
    cluster: Cluster, http: httpx.Client
) -> None:
    env = {"BROOK_RETENTION_SECONDS": "2"}
    cluster.api(**env)
    cluster.dispatcher(**env)
    quick = [http.post("/jobs", json={"task": "noop"}).json()["id"] for _ in range(5)]
    running = http.post("/jobs", json={"task": "sleep", "payload": {"seconds": 20}}).json()["id"]
    later = http.post("/jobs", json={"task": "noop", "delay": 3600}).json()["id"]
    kept = http.post("/jobs", json={"task": "noop", "retention_s": 3600}).json()["id"]
    for job_id in [*quick, kept]:
        wait_terminal(http, job_id)
    wait_until(
        lambda: all(http.get(f"/jobs/{i}").status_code == 404 for i in quick), timeout=30
    )
    assert http.get(f"/jobs/{running}").json()["status"] == "running"
    assert http.get(f"/jobs/{later}").json()["status"] == "pending"
    assert http.get(f"/jobs/{kept}").json()["status"] == "completed"


def test_the_cli_submits_many_retries_and_lists_queues(cluster: Cluster, http: httpx.Client) -> None:
    cluster.api()
    out = brook(cluster, "submit", "noop", "--queue", "bulk", "--count", "2500")
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split()
    assert len(ids) == len(set(ids)) == 2500
    listed = brook(cluster, "ls", "--queue", "bulk", "--limit", "3")
    assert listed.stdout.split()[0] == ids[-1] and "bulk" in listed.stdout
    failed = http.post("/jobs", json={"task": "noop", "delay": 3600}).json()["id"]
    http.post(f"/jobs/{failed}/cancel")
    retried = brook(cluster, "retry", failed)
    assert retried.returncode == 0 and json.loads(retried.stdout)["status"] == "pending"
    again = brook(cluster, "retry", failed)
    assert again.returncode == 1 and again.stderr.startswith("brook: error: 409 ")
    table = brook(cluster, "queue", "ls")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:]}
    assert rows["bulk"][2] == "2500" and rows["default"][2] == "1"  # waiting, pending, ...
    bad = brook(cluster, "submit", "noop", "--count", "3", "--wait")
    assert bad.returncode == 2 and "--count" in bad.stderr
