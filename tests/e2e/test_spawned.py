"""A cancel that reaches spawned jobs, on real processes: a tree spawned with `ctx.submit`
across two dispatchers is cancelled from the CLI mid-run, one dispatcher is SIGKILLed
as the cancel goes down (the other's sweep ends what it held), and every spawned job ends
`ParentCancelled` but the detached one, which runs on. (A propagation itself cut short
and finished by the sweep: `tests/integration/test_spawned.py`.)"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.conftest import Cluster, wait_terminal
from tests.support.procs import BrookProcess, wait_until

TASKS = "tests.tasks.basic,tests.tasks.spawning"


def spawned(http: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = http.get("/jobs", params={"spawned_by": job_id}).json()["jobs"]
    return jobs


def started_on(procs: list[BrookProcess], job_id: str) -> BrookProcess | None:
    started = [p for p in procs if any(e.get("job_id") == job_id for e in p.events("task.started"))]
    return started[0] if started else None


async def test_a_cancelled_tree_ends_parent_cancelled_through_a_killed_dispatcher_but_a_detached_job_runs_on(
    cluster: Cluster, http: httpx.Client
) -> None:
    api = cluster.api(BROOK_TASKS=TASKS)
    disps = [cluster.dispatcher(BROOK_TASKS=TASKS, BROOK_CONCURRENCY="3") for _ in range(2)]
    root = http.post("/jobs", json={"task": "tree_root", "payload": {"detached_s": 6}}).json()

    def tree() -> list[dict[str, Any]] | None:
        kids = spawned(http, root["id"])
        branch = [k for k in kids if k["task"] == "tree_branch"]
        leaves = spawned(http, branch[0]["id"]) if branch else []
        jobs = kids + leaves
        settled = [j for j in jobs if j["status"] == "running" or j["waiting_for"]]
        return jobs if len(jobs) == 5 and len(settled) == 5 else None

    jobs = wait_until(tree, timeout=30)
    ids = {j["id"] for j in jobs}
    assert all(j["spawned_by"] in (root["id"], *ids) for j in jobs)
    detached = next(
        j for j in http.get("/jobs", params={"task": "tree_hold"}).json()["jobs"]
        if j["id"] not in ids
    )
    assert detached["spawned_by"] is None
    leaf = next(j for j in jobs if j["spawned_by"] != root["id"])
    doomed: BrookProcess = wait_until(lambda: started_on(disps, leaf["id"]), timeout=10)

    # SIGKILLed as the cancel goes down the tree: the running jobs it held (their leases
    # not expired yet) are asked to stop, and nobody but the other's sweep ends them.
    doomed.kill()
    out = cluster.cli("cancel", root["id"])
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["spawned_cancelled"] == 5 and answer["id"] == root["id"]
    untouched = http.get(f"/jobs/{detached['id']}").json()
    assert untouched["status"] != "cancelled" and not untouched["cancel_requested"]

    for job_id in ids:
        done = wait_terminal(http, job_id, timeout=30)
        assert done["status"] == "cancelled", done
        assert done["error"]["type"] == "ParentCancelled", done
        assert done["error"]["message"].endswith(done["spawned_by"])
    assert wait_terminal(http, root["id"])["status"] == "cancelled"
    assert wait_terminal(http, detached["id"], timeout=30)["status"] == "completed"
    # Every job the cancel changed is one audit line of the API's, naming its spawner.
    lines = [*api.events("job.cancelled"), *api.events("job.cancel_requested")]
    changed = [e for e in lines if e.get("error_type") == "ParentCancelled"]
    assert sorted(e["job_id"] for e in changed) == sorted(ids)
    assert all(e["via"] == "cancel" and "by" in e for e in changed)
