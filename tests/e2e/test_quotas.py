"""Quotas with real dispatchers: named limits shared by every queue and task, held across
dispatchers, measured from the server's own timestamps (each attempt's history); bad input
refused with a 422 that stores nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster
from tests.e2e.test_faults import wait_all_terminal
from tests.support.limits import Attempt, max_overlap, runs
from tests.support.procs import wait_until

TASKS = "tests.tasks.basic,tests.tasks.quotas"


def started(docs: list[dict[str, Any]]) -> list[Attempt]:
    """The attempts that started (a claim a quota held back is not one): from each `running`
    entry of the history to the next entry."""
    out: list[Attempt] = []
    for doc in docs:
        history = list(doc.get("history") or [])
        assert not doc.get("history_truncated")
        for i, entry in enumerate(history):
            if entry["status"] != "running":
                continue
            after = history[i + 1] if i + 1 < len(history) else None
            if after is not None and after.get("reason") == "quota":
                continue
            end = after["at"] if after is not None else None
            out.append(Attempt(str(doc["_id"]), int(entry["attempt"]), entry["at"], end))
    return out


def by_id(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(d["_id"]): d for d in docs}


def max_units_in_window(starts: list[tuple[Any, int]], per_seconds: float) -> int:
    """The most units started in any window `[t, t + per_seconds)`."""
    ordered = sorted((t.replace(tzinfo=None), n) for t, n in starts)
    width = timedelta(seconds=per_seconds)
    peak = 0
    for i, (t, _) in enumerate(ordered):
        peak = max(peak, sum(n for s, n in ordered[i:] if s < t + width))
    return peak


def submit_many(http: httpx.Client, specs: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for i in range(0, len(specs), 500):
        r = http.post("/jobs/batch", json={"jobs": specs[i : i + 500]})
        assert r.status_code == 202, r.text
        out += [j["id"] for j in r.json()["jobs"]]
    return out


async def test_bad_quota_input_gets_a_clear_422_and_stores_nothing(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    ok = http.put("/quotas/openai:gpt-4o", json={"units": {"limit": 1000, "per_seconds": 60}})
    assert ok.status_code == 200, ok.text
    assert ok.json()["units"] == {"limit": 1000, "per_seconds": 60.0}
    job = {"task": "noop"}
    bad_jobs: dict[str, dict[str, Any]] = {
        "negative cost": {**job, "quotas": {"openai:gpt-4o": -1}},
        "over the window": {**job, "quotas": {"openai:gpt-4o": 1001}},
        "unknown quota": {**job, "quotas": {"openai:gpt-4": 10}},
        "bad quota name": {**job, "quotas": {"has space": 10}},
        "not a number": {**job, "quotas": {"openai:gpt-4o": "10"}},
    }
    for why, body in bad_jobs.items():
        r = http.post("/jobs", json=body)
        assert r.status_code == 422, (why, r.text)
        assert "quota" in r.text or "cost" in r.text, (why, r.text)
        batch = http.post("/jobs/batch", json={"jobs": [job, body]})
        assert batch.status_code == 422, (why, batch.text)
        assert batch.json()["detail"][0]["loc"][:2] == ["jobs", 1], batch.text
    assert await store.jobs.count_documents({}) == 0
    bad_quotas: dict[str, tuple[str, dict[str, Any]]] = {
        "no window": ("q1", {}),
        "no window, all null": ("q1", {"units": None, "requests": None, "concurrency": None}),
        "bad name": ("a b", {"concurrency": 2}),
        "dot in name": ("a.b", {"concurrency": 2}),
        "zero limit": ("q1", {"units": {"limit": 0, "per_seconds": 60}}),
        "no per_seconds": ("q1", {"requests": {"limit": 10}}),
        "unknown field": ("q1", {"tokens": 10}),
    }
    for why, (name, body) in bad_quotas.items():
        r = http.put(f"/quotas/{name}", json=body)
        assert r.status_code == 422, (why, r.text)
    names = [q["name"] for q in http.get("/quotas").json()["quotas"]]
    assert names == ["openai:gpt-4o"]
    # Clearing its last limit is refused too: a quota keeps one.
    r = http.put("/quotas/openai:gpt-4o", json={"units": None})
    assert r.status_code == 422 and http.get("/quotas/openai:gpt-4o").json()["units"]
    # A name with `/`; a field left out keeps its value; `null` clears one.
    put = http.put("/quotas/anthropic/claude", json={"concurrency": 3})
    assert put.status_code == 200, put.text
    put = http.put(
        "/quotas/anthropic/claude", json={"requests": {"limit": 50, "per_seconds": 60}}
    )
    assert put.json()["concurrency"] == 3 and put.json()["requests"]["limit"] == 50
    put = http.put("/quotas/anthropic/claude", json={"concurrency": None})
    assert put.json()["concurrency"] is None and put.json()["requests"]["limit"] == 50
    assert http.get("/quotas/anthropic/claude").status_code == 200
    assert http.delete("/quotas/anthropic/claude").status_code == 204
    assert http.get("/quotas/anthropic/claude").status_code == 404
    assert http.delete("/quotas/anthropic/claude").status_code == 404


async def test_three_dispatchers_share_a_quota_of_concurrency_and_units_even_one_sigkilled(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    put = http.put(
        "/quotas/provider",
        json={"concurrency": 10, "units": {"limit": 5000, "per_seconds": 10}},
    )
    assert put.status_code == 200, put.text
    dispatchers = [
        cluster.dispatcher(BROOK_TASKS=TASKS, BROOK_CONCURRENCY="8", BROOK_LEASE_SECONDS="5")
        for _ in range(3)
    ]
    # Two queues draw on the one quota; costs of 200 and 300 units.
    specs = [
        {
            "task": "quota_sleep",
            "queue": "a" if i % 2 else "b",
            "payload": {"seconds": 0.3},
            "quotas": {"provider": 200 if i % 2 else 300},
        }
        for i in range(60)
    ]
    ids = submit_many(http, specs)
    # SIGKILL one dispatcher while it holds the quota.
    wait_until(lambda: http.get("/quotas/provider").json()["running"] > 0, timeout=30)
    wait_until(lambda: dispatchers[0].events("job.claimed"), timeout=30)
    dispatchers[0].kill()
    await wait_all_terminal(store, len(ids), timeout=240)
    docs = await store.jobs.find({"_id": {"$in": ids}}).to_list()
    assert {d["status"] for d in docs} == {"completed"}
    # The tasks' own runs (each job's last attempt: its start and end as its dispatcher
    # stamped them), and the attempts the killed dispatcher held the quota for (it logs a
    # claim once the job's quotas are charged), from their claim to the watchdog's requeue.
    charged = {e["job_id"] for e in dispatchers[0].events("job.claimed")}
    killed = [
        a
        for a in started(docs)
        if a.attempt < by_id(docs)[a.job_id]["attempts"] and a.job_id in charged
    ]
    assert killed  # it died holding the quota
    spans = runs(docs) + killed
    assert max_overlap(spans) <= 10
    assert max_overlap(spans) >= 5  # the quota, not something else, was the bound
    cost = {d["_id"]: d["quotas"]["provider"] for d in docs}
    units = [(a.start, cost[a.job_id]) for a in spans]
    # A charge stays charged (the provider may have been called): the killed dispatcher's
    # started attempts count too.
    assert max_units_in_window(units, 10.0) <= 5000
    # Nothing leaked: every hold released, the killed one's included.
    wait_until(lambda: http.get("/quotas/provider").json()["running"] == 0, timeout=30)
    shown = http.get("/quotas/provider").json()
    assert shown["totals"]["minutes"], shown
    assert sum(m["requests"] for m in shown["totals"]["minutes"]) >= 60
