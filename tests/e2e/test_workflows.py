"""Workflows end to end: real `brook api` / `brook dispatcher` processes run DAGs submitted
over HTTP, cancel the dependents of a failed parent, fan in and out by the thousand, and
lose no release when the dispatcher dies between a parent's completion and its child's."""

from __future__ import annotations

import subprocess
from typing import Any

import httpx

from brook import AsyncClient
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster, wait_terminal
from tests.support.checker import check_history, settled_logs
from tests.support.procs import BrookProcess, wait_until

TASKS = "tests.tasks.basic,tests.tasks.workflow"
# Tests of the path that settles a parent's dependents (its completion or failure): the
# dispatcher's sweep (every second in tests) runs at start and not again within the test, so
# it cannot settle a child first, in the few ms between the parent's write and the settle.
NO_SWEEP = {"BROOK_SWEEP_SECONDS": "60"}


def events(procs: list[BrookProcess], name: str, job_id: str) -> list[dict[str, Any]]:
    return [e for p in procs for e in p.events(name) if e.get("job_id") == job_id]


def unblocked_line(proc: BrookProcess, job_id: str) -> dict[str, Any]:
    """The job's one `job.unblocked` line."""
    line = proc.wait_for_event("job.unblocked", where=lambda e: e.get("job_id") == job_id)
    assert len(events([proc], "job.unblocked", job_id)) == 1
    return line


def batch(http: httpx.Client, *specs: dict[str, Any]) -> list[dict[str, Any]]:
    resp = http.post("/jobs/batch", json={"jobs": list(specs)})
    assert resp.status_code == 202, resp.text
    jobs: list[dict[str, Any]] = resp.json()["jobs"]
    return jobs


async def assert_clean(store: JobStore, ids: list[str], *procs: BrookProcess) -> None:
    logs = await settled_logs(store, lambda: [e for p in procs for e in p.logs()])
    report = await check_history(store, ids, logs)
    assert report.problems == []


async def test_a_diamond_in_one_batch_runs_d_once_after_b_and_c_and_d_sees_both_results(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    api = cluster.api(BROOK_TASKS=TASKS)
    disp = cluster.dispatcher(BROOK_TASKS=TASKS, **NO_SWEEP)
    a, b, c, d = batch(
        http,
        {"task": "step", "ref": "a", "payload": {"name": "a", "seconds": 1.5}},
        {"task": "step", "ref": "b", "depends_on": ["a"], "payload": {"name": "b", "seconds": 0.4}},
        {"task": "step_sync", "ref": "c", "depends_on": ["a"], "payload": {"name": "c"}},
        {"task": "step_sync", "depends_on": ["b", "c"], "payload": {"name": "d"}},
    )
    assert [j["status"] for j in (a, b, c, d)] == ["pending", "waiting", "waiting", "waiting"]
    assert d["depends_on"] == [b["id"], c["id"]] and b["depends_on"] == [a["id"]]
    listed = http.get("/jobs", params={"status": "waiting"}).json()["jobs"]
    assert {j["id"] for j in listed} == {b["id"], c["id"], d["id"]}  # a is still running
    done = wait_terminal(http, d["id"])
    assert done["status"] == "completed", done
    rb, rc = (http.get(f"/jobs/{j['id']}").json()["result"] for j in (b, c))
    assert done["result"]["parents"] == {b["id"]: rb, c["id"]: rc}
    assert done["result"]["started"] >= max(rb["ended"], rc["ended"])
    assert rb["parents"] == rc["parents"] == {a["id"]: http.get(f"/jobs/{a['id']}").json()["result"]}
    assert len(events([disp], "task.started", d["id"])) == 1
    for job in (b, c, d):
        # Logged once the release is written and read back: possibly after its claim.
        unblocked = unblocked_line(disp, job["id"])
        assert unblocked["via"] == "completion"
    assert [h["status"] for h in done["history"]] == ["waiting", "pending", "running", "completed"]
    await assert_clean(store, [a["id"], b["id"], c["id"], d["id"]], api, disp)


async def test_a_failed_parent_cancels_its_child_with_dependency_failed(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    api = cluster.api(BROOK_TASKS=TASKS)
    disp = cluster.dispatcher(BROOK_TASKS=TASKS, **NO_SWEEP)
    a, b, c, d = batch(
        http,
        {"task": "noop", "ref": "a"},
        {"task": "fail", "ref": "b", "depends_on": ["a"], "max_attempts": 1},
        {"task": "step", "ref": "c", "depends_on": ["a"], "payload": {"seconds": 0.5}},
        {"task": "step", "depends_on": ["b", "c"]},
    )
    orphan = wait_terminal(http, d["id"])
    assert orphan["status"] == "cancelled"
    assert orphan["error"] == {"type": "DependencyFailed", "message": f"parent {b['id']} failed"}
    assert wait_terminal(http, c["id"])["status"] == "completed"  # c was not b's dependent
    assert events([disp], "task.started", d["id"]) == []  # d never ran
    line = disp.wait_for_event("job.dependency_failed", where=lambda e: e.get("job_id") == d["id"])
    assert len(events([disp], "job.dependency_failed", d["id"])) == 1
    assert line["error_type"] == "DependencyFailed" and line["via"] == "failure"
    await assert_clean(store, [a["id"], b["id"], c["id"], d["id"]], api, disp)


async def test_a_fan_out_and_a_fan_in_of_1000_complete(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    api = cluster.api(BROOK_TASKS=TASKS)
    disp = cluster.dispatcher(BROOK_TASKS=TASKS, BROOK_CONCURRENCY="8")
    fan_out = batch(
        http,
        {"task": "noop", "ref": "root"},
        *({"task": "noop", "depends_on": ["root"], "payload": {"i": i}} for i in range(999)),
    )
    parents = batch(http, *({"task": "noop", "payload": {"i": i}} for i in range(1000)))
    resp = http.post("/jobs", json={"task": "step", "depends_on": [p["id"] for p in parents]})
    assert resp.status_code == 202, resp.text
    child = wait_terminal(http, resp.json()["id"], timeout=180)
    assert child["status"] == "completed"
    assert child["result"]["parents"] == {p["id"]: None for p in parents}
    wait_until(lambda: completed(http) == 2001, timeout=120)
    ids = [j["id"] for j in fan_out + parents] + [child["id"]]
    await assert_clean(store, ids, api, disp)


def completed(http: httpx.Client) -> int:
    queues = http.get("/queues").json()["queues"]
    return sum(q["counts"].get("completed", 0) for q in queues)


async def test_a_dispatcher_killed_between_a_parents_completion_and_the_release_leaves_it_to_the_sweep(
    cluster: Cluster, store: JobStore, settings: Settings
) -> None:
    doomed = cluster.dispatcher(BROOK_TASKS=f"{TASKS},tests.tasks.workflow_crash")
    async with AsyncClient(settings.mongo_uri, settings.db) as client:
        parent, child = await client.submit_many(
            [
                {"task": "step", "ref": "p", "payload": {"name": "p"}},
                {"task": "step", "depends_on": ["p"], "payload": {"name": "child"}},
            ]
        )
        wait_until(lambda: doomed.proc.poll() is not None, timeout=30)
        assert doomed.proc.returncode == 137  # it died right after the completion's write
        done = await client.get(parent.id)
        assert done.status == "completed" and done.expire_at is None  # kept for its child
        assert (await client.get(child.id)).status == "waiting"
        heir = cluster.dispatcher(BROOK_TASKS=TASKS)
        finished = await client.wait(child.id, timeout=60)
    assert finished.status == "completed"
    assert finished.result["parents"] == {parent.id: done.result}
    assert unblocked_line(heir, child.id)["via"] == "sweep"
    assert (await store.get(parent.id)).expire_at is not None  # settled: retention runs
    heir.wait_for_event("job.completed", where=lambda e: e.get("job_id") == child.id)
    report = await check_history(store, [parent.id, child.id], [*doomed.logs(), *heir.logs()])
    # The parent's `job.completed` line died with its dispatcher, before it was written.
    assert report.problems == [f"{parent.id} has 0 job.completed log lines"]


async def test_a_child_submitted_by_its_running_parent_runs_after_it(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    disp = cluster.dispatcher(BROOK_TASKS=TASKS, **NO_SWEEP)
    parent = http.post("/jobs", json={"task": "spawn_dependent", "payload": {"seconds": 0.5}})
    parent_id = parent.json()["id"]
    parent_done = wait_terminal(http, parent_id)
    assert parent_done["status"] == "completed" and parent_done["result"]["status"] == "waiting"
    child = wait_terminal(http, parent_done["result"]["child"])
    assert child["status"] == "completed"
    assert child["result"]["parents"] == {parent_id: parent_done["result"]}
    # The dispatcher's claim did not know of the child; its completion found out.
    assert unblocked_line(disp, child["id"])["via"] == "completion"


async def test_cycles_and_unknown_parents_are_refused_and_nothing_is_stored(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    resp = http.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"task": "noop", "ref": "x", "depends_on": ["z"]},
                {"task": "noop", "ref": "y", "depends_on": ["x"]},
                {"task": "noop", "ref": "z", "depends_on": ["y"]},
            ]
        },
    )
    assert resp.status_code == 422
    assert resp.json()["detail"] == [
        {
            "loc": ["jobs", 0, "depends_on"],
            "msg": "dependency cycle: x -> z -> y -> x",
            "type": "dependency_cycle",
        }
    ]
    resp = http.post("/jobs", json={"task": "noop", "depends_on": ["0123456789abcdef01234567"]})
    assert resp.status_code == 404 and resp.json()["detail"][0]["loc"] == ["depends_on", 0]
    assert await store.jobs.count_documents({}) == 0


def test_the_cli_submits_with_depends_on_and_lists_waiting_jobs(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(BROOK_TASKS=TASKS)  # no dispatcher: the parent stays pending
    parent = http.post("/jobs", json={"task": "noop"}).json()["id"]

    def brook(*args: str) -> subprocess.CompletedProcess[str]:
        return cluster.cli(*args, BROOK_TASKS=TASKS)

    out = brook("submit", "noop", "--depends-on", parent, "--run-on-parent-failure")
    assert out.returncode == 0, out.stderr
    assert '"status": "waiting"' in out.stdout and '"run_on_parent_failure": true' in out.stdout
    listed = brook("ls", "--status", "waiting")
    assert listed.returncode == 0 and listed.stdout.split()[1] == "waiting"
    assert brook("cancel", parent).returncode == 0  # run_on_parent_failure: released anyway
    child = listed.stdout.split()[0]
    assert http.get(f"/jobs/{child}").json()["status"] == "pending"
