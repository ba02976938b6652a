"""Quotas with real dispatchers: named limits shared by every queue and task, held across
dispatchers, measured from the server's own timestamps (each attempt's history); bad input
refused with a 422 that stores nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
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
    put = http.put("/quotas/anthropic/claude", json={"requests": {"limit": 50, "per_seconds": 60}})
    assert put.json()["concurrency"] == 3 and put.json()["requests"]["limit"] == 50
    put = http.put("/quotas/anthropic/claude", json={"concurrency": None})
    assert put.json()["concurrency"] is None and put.json()["requests"]["limit"] == 50
    assert http.get("/quotas/anthropic/claude").status_code == 200
    assert http.delete("/quotas/anthropic/claude").json() == {"deleted": "anthropic/claude"}
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


async def job_doc(store: JobStore, job_id: str) -> dict[str, Any]:
    doc = await store.jobs.find_one({"_id": job_id})
    assert doc is not None
    return doc


def post(http: httpx.Client, body: dict[str, Any]) -> str:
    r = http.post("/jobs", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


async def test_reported_usage_frees_units_a_waiting_job_uses_and_an_overdraft_holds_the_next(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    put = http.put("/quotas/tokens", json={"units": {"limit": 1000, "per_seconds": 10}})
    assert put.status_code == 200, put.text
    cluster.dispatcher(BROOK_TASKS=TASKS, BROOK_CONCURRENCY="4")
    # A estimates the whole window, reports 100 used, and keeps running: the 900 refunded
    # let B (800) start while A still runs, not when A's charge leaves the window.
    a = post(
        http,
        {
            "task": "quota_usage",
            "payload": {"quota": "tokens", "used": 100, "seconds": 3},
            "quotas": {"tokens": 1000},
        },
    )
    wait_until(lambda: http.get("/quotas/tokens").json()["used"]["units"] == 100, timeout=30)
    b = post(http, {"task": "quota_sleep", "payload": {"seconds": 0}, "quotas": {"tokens": 800}})
    await wait_all_terminal(store, 2, timeout=60)
    doc_a, doc_b = await job_doc(store, a), await job_doc(store, b)
    assert doc_b["started_at"] < doc_a["finished_at"]
    assert doc_a["quota_usage"] == {"tokens": 100}
    # C estimates 100 and reports 1,500: the window is overdrawn by 600 (a debt, shown), and
    # D waits until C's charge has left the window, however little it costs.
    c = post(
        http,
        {
            "task": "quota_usage",
            "payload": {"quota": "tokens", "used": 1500},
            "quotas": {"tokens": 100},
        },
    )
    await wait_all_terminal(store, 3, timeout=60)
    shown = http.get("/quotas/tokens").json()
    assert shown["debt"] > 0, shown
    d = post(http, {"task": "quota_sleep", "payload": {"seconds": 0}, "quotas": {"tokens": 1}})
    held = wait_until(lambda: http.get(f"/jobs/{d}").json()["waiting_for"], timeout=30)
    assert held["kind"] == "quota" and held["name"] == "tokens"
    await wait_all_terminal(store, 4, timeout=60)
    doc_c, doc_d = await job_doc(store, c), await job_doc(store, d)
    assert (doc_d["started_at"] - doc_c["started_at"]).total_seconds() >= 10
    ledger = http.get("/quotas/tokens").json()["totals"]["days"][0]
    assert ledger["units"] == 100 + 800 + 1500 + 1 and ledger["requests"] == 4
    metrics = http.get("/metrics").text
    assert 'brook_quota_units_total{quota="tokens"} 2401.0' in metrics


async def test_usage_reported_inside_a_step_is_not_charged_again_when_the_step_replays(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    put = http.put("/quotas/steps", json={"units": {"limit": 10000, "per_seconds": 60}})
    assert put.status_code == 200, put.text
    cluster.dispatcher(BROOK_TASKS=TASKS)
    job = post(
        http,
        {
            "task": "quota_step_usage",
            "payload": {"quota": "steps", "used": 700},
            "quotas": {"steps": 200},
        },
    )
    await wait_all_terminal(store, 1, timeout=60)
    doc = await job_doc(store, job)
    assert doc["status"] == "completed" and doc["attempts"] == 2
    # Attempt 1: 200 charged, corrected to 700. Attempt 2: 200 charged, the step replayed
    # (its usage not reported again, so not corrected again).
    ledger = http.get("/quotas/steps").json()["totals"]["days"][0]
    assert ledger["units"] == 700 + 200 and ledger["requests"] == 2


async def test_rate_limited_closes_the_quota_for_every_dispatcher_and_keeps_the_jobs_budget(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    put = http.put("/quotas/model", json={"requests": {"limit": 1000, "per_seconds": 2}})
    assert put.status_code == 200, put.text
    for _ in range(2):
        cluster.dispatcher(BROOK_TASKS=TASKS, BROOK_CONCURRENCY="4")
    first = post(
        http,
        {
            "task": "quota_429",
            "payload": {"quota": "model", "delay": 3, "refusals": 1},
            "quotas": {"model": 1},
        },
    )
    closed = wait_until(lambda: http.get("/quotas/model").json()["closed_until"], timeout=30)
    # While it is closed, no dispatcher starts a job that draws on it.
    others = [
        post(http, {"task": "quota_sleep", "payload": {"seconds": 0}, "quotas": {"model": 1}})
        for _ in range(6)
    ]
    await wait_all_terminal(store, 7, timeout=60)
    until = datetime.fromisoformat(closed)
    for job_id in others:
        doc = await job_doc(store, job_id)
        assert doc["status"] == "completed" and doc["started_at"] >= until
    # Its budget untouched: the start counted (the fencing token), max_attempts grew by one.
    doc = await job_doc(store, first)
    assert doc["status"] == "completed" and doc["result"] == 2
    assert doc["attempts"] == 2 and doc["max_attempts"] == 4
    assert any(h.get("reason") == "quota" for h in doc["history"])
    # Three 429s in a row, each within a window of the last: the effective rate is lower.
    assert http.get("/quotas/model").json()["effective_rate"] == 1.0
    post(
        http,
        {
            "task": "quota_429",
            "payload": {"quota": "model", "delay": 0.2, "refusals": 3},
            "quotas": {"model": 1},
            "max_attempts": 1,
        },
    )
    await wait_all_terminal(store, 8, timeout=60)
    shown = http.get("/quotas/model").json()
    assert shown["strikes"] == 3 and shown["effective_rate"] < 1.0, shown
    # Calm windows step it back up to the whole rate.
    wait_until(lambda: http.get("/quotas/model").json()["effective_rate"] == 1.0, timeout=60)


async def test_two_tenants_under_one_quota_each_get_their_share_whatever_their_backlogs(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    put = http.put("/quotas/shared", json={"units": {"limit": 1000, "per_seconds": 2}})
    assert put.status_code == 200, put.text
    # Tenant a's backlog is older and three times b's: taken in claim order, a's jobs would
    # get three starts of every four.
    spec = {"task": "quota_sleep", "payload": {"seconds": 0}, "quotas": {"shared": 100}}
    submit_many(http, [{**spec, "key": "a"} for _ in range(150)])
    submit_many(http, [{**spec, "key": "b"} for _ in range(50)])
    for _ in range(2):
        cluster.dispatcher(BROOK_TASKS=TASKS, BROOK_CONCURRENCY="4")
    await wait_all_terminal(store, 100, timeout=120)  # 100 of the 200 ended
    docs = await store.jobs.find({"status": "completed"}).to_list()
    # After the first window (a's oldest jobs fill it before b is refused room), 80 starts:
    # 8 windows' worth, while both backlogs last.
    starts = sorted(docs, key=lambda d: d["started_at"])[10:90]
    share = {k: sum(1 for d in starts if d["key"] == k) / len(starts) for k in ("a", "b")}
    # Without fair shares b gets a quarter (0.21 seen); with them, at least 40% each (the
    # issue's bound): 0.44-0.50 seen under load 12-24.
    assert share["a"] >= 0.40 and share["b"] >= 0.40, share


async def test_a_tasks_declared_quotas_apply_unless_the_submit_names_its_own(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(BROOK_TASKS=TASKS)
    # `quota_default` declares quotas={"tq": 100}: one job's worth a minute.
    put = http.put("/quotas/tq", json={"units": {"limit": 100, "per_seconds": 60}})
    assert put.status_code == 200, put.text
    cluster.dispatcher(BROOK_TASKS=TASKS)
    first = post(http, {"task": "quota_default"})
    await wait_all_terminal(store, 1, timeout=60)
    second = post(http, {"task": "quota_default"})
    held = wait_until(lambda: http.get(f"/jobs/{second}").json()["waiting_for"], timeout=30)
    assert held["kind"] == "quota" and held["name"] == "tq"
    # A value given at submit wins: no quota at all here.
    free = post(http, {"task": "quota_default", "quotas": {}})
    await wait_all_terminal(store, 2, timeout=60)
    assert (await job_doc(store, free))["status"] == "completed"
    assert (await job_doc(store, first))["status"] == "completed"
    assert (await job_doc(store, second))["status"] == "pending"
    assert http.post(f"/jobs/{second}/cancel").status_code == 200


def test_brook_quota_sets_lists_shows_and_removes_a_quota(cluster: Cluster) -> None:
    cluster.api()
    made = cluster.cli(
        "quota", "set", "openai:gpt-4o", "--units", "90000/60", "--requests", "500/60"
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["units"] == {"limit": 90000, "per_seconds": 60.0}
    listed = cluster.cli("quota", "ls")
    assert listed.returncode == 0 and "openai:gpt-4o" in listed.stdout
    assert "units=90000/60s" in listed.stdout and "requests=500/60s" in listed.stdout
    shown = cluster.cli("quota", "show", "openai:gpt-4o")
    assert shown.returncode == 0, shown.stderr
    body = json.loads(shown.stdout)
    assert body["effective_rate"] == 1.0 and body["debt"] == 0 and "totals" in body
    cleared = cluster.cli("quota", "set", "openai:gpt-4o", "--requests", "none")
    assert json.loads(cleared.stdout)["requests"] is None
    bad = cluster.cli("quota", "set", "openai:gpt-4o", "--units", "none")
    assert bad.returncode != 0 and "at least one" in bad.stderr
    # A job submitted from the CLI names it, with its cost; a cost over the window is a 422,
    # a malformed --quota a usage error, and neither makes a job.
    later = (datetime.now(UTC) + timedelta(days=300)).isoformat()
    sent = cluster.cli("submit", "noop", "--quota", "openai:gpt-4o=1200", "--run-at", later)
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["quotas"] == {"openai:gpt-4o": 1200}
    over = cluster.cli("submit", "noop", "--quota", "openai:gpt-4o=90001")
    assert over.returncode == 1 and "422" in over.stderr, over.stderr
    malformed = cluster.cli("submit", "noop", "--quota", "openai:gpt-4o")
    assert malformed.returncode == 2 and "NAME=COST" in malformed.stderr
    listed_jobs = httpx.get(f"{cluster.api_url}/jobs", params={"task": "noop"}, timeout=10)
    assert len(listed_jobs.json()["jobs"]) == 1, listed_jobs.text
    assert cluster.cli("quota", "rm", "openai:gpt-4o").returncode == 0
    gone = cluster.cli("quota", "show", "openai:gpt-4o")
    assert gone.returncode != 0 and "no quota" in gone.stderr
