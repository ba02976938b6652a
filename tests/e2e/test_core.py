"""The event-driven core end to end: real API and dispatcher processes, real replica set."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from pymongo.read_concern import ReadConcern

from brook.common.domain.models import JobSpec
from brook.common.store.jobs import JobStore
from tests.e2e.conftest import JSON, Cluster, wait_terminal
from tests.support.metrics import value


def test_a_job_submitted_over_http_completes_with_its_result(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api()
    disp = cluster.dispatcher()
    resp = http.post("/jobs", json={"task": "echo", "payload": {"x": 1}})
    assert resp.status_code == 202
    job = resp.json()
    assert resp.headers["location"] == f"/jobs/{job['id']}"
    assert job["status"] == "pending" and job["attempts"] == 0
    done = wait_terminal(http, job["id"])
    assert done["status"] == "completed" and done["result"] == {"x": 1} and done["error"] is None
    assert done["attempts"] == 1 and done["started_at"] and done["finished_at"]
    # The job's whole story is in the logs, one line per state change, with its id.
    story = [e["event"] for e in disp.logs() if e.get("job_id") == job["id"]]
    assert story[0] == "job.claimed" and story[-1] == "job.completed"
    claimed = disp.events("job.claimed")[0]
    assert claimed["attempt"] == 1 and claimed["task"] == "echo"
    assert {"timestamp", "level", "event"} <= set(claimed)


def test_get_list_and_cancel_follow_the_contract(cluster: Cluster, http: httpx.Client) -> None:
    cluster.api()
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    ids = [
        http.post("/jobs", json={"task": "noop", "run_at": later}).json()["id"] for _ in range(3)
    ]
    assert http.get("/jobs/doesnotexist").status_code == 404
    page = http.get("/jobs", params={"limit": 2}).json()
    assert [j["id"] for j in page["jobs"]] == ids[::-1][:2] and page["next"] == ids[1]
    rest = http.get("/jobs", params={"limit": 2, "after": page["next"]}).json()
    assert [j["id"] for j in rest["jobs"]] == [ids[0]] and rest["next"] is None
    assert http.get("/jobs", params={"status": "completed"}).json()["jobs"] == []
    assert http.get("/jobs", params={"status": "bogus"}).status_code == 422
    cancelled = http.post(f"/jobs/{ids[0]}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert http.post(f"/jobs/{ids[0]}/cancel").status_code == 409
    assert http.post("/jobs/nope/cancel").status_code == 404
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").status_code == 200
    metrics = http.get("/metrics").text
    assert (
        value(metrics, "brook_queue_depth", queue="default", status="pending") == 2
        and value(metrics, "brook_queue_depth", queue="default", status="cancelled") == 1
    )


async def test_bad_inputs_get_clear_errors_and_store_nothing(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api()
    deep: Any = {}
    node = deep
    for _ in range(32):
        node["a"] = {}
        node = node["a"]
    cases: list[tuple[Any, int, str]] = [
        ({"task": "nope"}, 422, "known tasks: cpu, crash, echo"),
        ({"task": "echo", "payload": {"$where": 1}}, 422, "starts with '$'"),
        ({"task": "echo", "payload": {"a": {"$set": 1}}}, 422, "starts with '$'"),
        ({"task": "echo", "payload": deep}, 422, "nesting deeper than 32"),
        ({"task": "echo", "priority": "high"}, 422, "priority"),
        ({"task": "echo", "priority": 1.5}, 422, "priority"),
        ({"task": "echo", "max_attempts": 0}, 422, "max_attempts"),
        ({"task": "echo", "timeout_s": -1}, 422, "timeout_s"),
        ({"task": "echo", "run_at": "not a date"}, 422, "run_at"),
        ({"task": "echo", "payload": [1, 2]}, 422, "payload"),
        ({"task": "echo", "surprise": 1}, 422, "surprise"),
        ({"payload": {}}, 422, "task"),
        ([1, 2, 3], 422, "JSON object"),
    ]
    for body, code, needle in cases:
        resp = http.post("/jobs", json=body)
        assert resp.status_code == code, (body, resp.text)
        assert needle in json.dumps(resp.json()["detail"]), (body, resp.text)
    assert (
        http.post(
            "/jobs", content=b"{not json", headers={"content-type": "application/json"}
        ).status_code
        == 422
    )
    very_deep = b'{"task": "echo", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert http.post("/jobs", content=very_deep, headers=JSON).status_code == 422
    big = {"task": "echo", "payload": {"blob": "x" * (1024 * 1024)}}
    resp = http.post("/jobs", json=big)
    assert resp.status_code == 413 and "larger than" in resp.json()["detail"]
    assert await store.jobs.count_documents({}) == 0  # nothing invalid is ever stored


def test_a_bearer_token_guards_every_endpoint_but_health(cluster: Cluster) -> None:
    cluster.api(BROOK_API_TOKEN="s3cret")
    url = cluster.api_url
    assert httpx.get(f"{url}/healthz").status_code == 200
    for method, path in [
        ("POST", "/jobs"),
        ("GET", "/jobs"),
        ("GET", "/jobs/x"),
        ("POST", "/jobs/x/cancel"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/redoc"),
    ]:
        assert httpx.request(method, f"{url}{path}").status_code == 401
        wrong = httpx.request(method, f"{url}{path}", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["detail"]
    assert httpx.get(f"{url}/readyz").status_code == 200
    token = {"Authorization": "Bearer s3cret"}
    ok = httpx.post(f"{url}/jobs", json={"task": "noop"}, headers=token)
    assert ok.status_code == 202
    assert "/jobs" in httpx.get(f"{url}/openapi.json", headers=token).json()["paths"]
    for page in ("/docs", "/redoc"):
        assert "/openapi.json" in httpx.get(f"{url}{page}", headers=token).text


def test_a_resubmitted_idempotency_key_returns_the_existing_job(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api()

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=cluster.api_url, timeout=30) as client:
            body = {"task": "noop", "idempotency_key": "order-42"}
            return await asyncio.gather(*[client.post("/jobs", json=body) for _ in range(20)])

    responses = asyncio.run(burst())
    assert sorted(r.status_code for r in responses) == [200] * 19 + [202]
    assert len({r.json()["id"] for r in responses}) == 1
    assert len(http.get("/jobs").json()["jobs"]) == 1


async def test_concurrency_2_never_runs_more_than_2_at_once(
    cluster: Cluster, store: JobStore
) -> None:
    for _ in range(200):
        await store.submit(JobSpec(task="sleep", payload={"seconds": 0.005}))
    cluster.dispatcher()
    deadline = time.monotonic() + 60
    while await store.jobs.count_documents({"status": "completed"}) < 200:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    edges: list[tuple[datetime, int]] = []
    async for doc in store.jobs.find({}):
        assert doc["attempts"] == 1
        edges += [(doc["started_at"], 1), (doc["finished_at"], -1)]
    running = peak = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        running += step
        peak = max(peak, running)
    assert peak == 2  # both slots were used, never a third


# The tests below run the dispatcher with a 30 s watchdog sweep and deadlines far shorter:
# what passes them is the start-up sweep, the change stream, its resume token and the due
# timer, never the slow path.
SLOW_SWEEP = {"BROOK_SWEEP_SECONDS": "30"}


async def completed_within(store: JobStore, ids: list[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while await store.jobs.count_documents({"_id": {"$in": ids}, "status": "completed"}) < len(ids):
        assert time.monotonic() < deadline, f"not all {len(ids)} jobs completed in {seconds}s"
        await asyncio.sleep(0.05)


async def test_priorities_and_run_at_are_honoured(cluster: Cluster, store: JobStore) -> None:
    cluster.settings = cluster.settings.model_copy(update={"concurrency": 1})

    async def noop(priority: int, run_at: datetime | None = None) -> str:
        spec = JobSpec(task="noop", payload={}, priority=priority, run_at=run_at)
        return (await store.submit(spec)).job.id

    low = [await noop(0) for _ in range(3)]
    high = [await noop(10) for _ in range(3)]
    # Due after start-up: its timer is armed from what the start-up sweep finds next. Far
    # enough ahead that a dispatcher slow to start (a busy machine: several seconds) still
    # finds it not yet due, which is the case this proves.
    armed_at_start = await noop(99, datetime.now(UTC) + timedelta(seconds=15))
    cluster.dispatcher(**SLOW_SWEEP)
    await completed_within(store, [*low, *high], 10)
    # Submitted to an idle dispatcher whose timer waits for the job above: only the change
    # stream's event can arm the earlier timer this one needs.
    armed_by_event = await noop(99, datetime.now(UTC) + timedelta(seconds=1))
    await completed_within(store, [armed_at_start, armed_by_event], 25)
    docs = await store.jobs.find({}).sort("started_at", 1).to_list()
    assert [d["_id"] for d in docs] == [*high, *low, armed_by_event, armed_at_start]
    for doc in docs[-2:]:
        lag = (doc["started_at"] - doc["run_at"]).total_seconds()
        assert 0 <= lag < 0.3, (doc["_id"], lag)  # the timer fired when due, not a sweep later


async def test_a_dispatcher_started_after_jobs_were_inserted_runs_the_whole_backlog(
    cluster: Cluster, store: JobStore
) -> None:
    ids = [(await store.submit(JobSpec(task="noop", payload={}))).job.id for _ in range(50)]
    cluster.dispatcher(**SLOW_SWEEP)
    await completed_within(store, ids, 10)  # the start-up sweep found them all


async def stream_cursor(store: JobStore, proc: Any) -> dict[str, Any]:
    """The server's view of the change stream cursor `proc` follows on the jobs collection."""
    admin = store.db.client.get_database("admin", read_concern=ReadConcern("local"))
    ops = await (await admin.aggregate([{"$currentOp": {"idleCursors": True}}])).to_list()
    cursors = [
        op["cursor"]
        for op in ops
        if op.get("ns") == f"{store.db.name}.jobs"
        and op.get("appName") == f"brook-dispatcher:{proc.pid}"
        and "$changeStream" in str(op.get("cursor", {}).get("originatingCommand", {}))
    ]
    assert len(cursors) == 1, ops
    cursor: dict[str, Any] = cursors[0]
    return cursor


async def test_a_restarted_dispatcher_resumes_from_its_token_and_misses_nothing(
    cluster: Cluster, store: JobStore
) -> None:
    first = cluster.dispatcher(**SLOW_SWEEP)
    await store.submit(JobSpec(task="noop", payload={}))
    first.wait_for_event("job.completed")
    assert first.stop() == 0
    saved = await store.tokens.state.find_one({})
    assert saved is not None and saved["token"]
    ids = [(await store.submit(JobSpec(task="noop", payload={}))).job.id for _ in range(20)]
    # The saved token marks exactly where the first dispatcher stopped: resuming from it
    # replays the 20 inserts made since, and nothing it had already seen.
    assert await inserts_after(store, saved["token"]) == ids
    second = cluster.dispatcher(**SLOW_SWEEP)
    await completed_within(store, ids, 10)
    assert second.events("stream.resumed") and not second.events("stream.opened")
    # And the second dispatcher's stream was opened at that token (the server's view).
    opened = (await stream_cursor(store, second))["originatingCommand"]["pipeline"][0]
    assert opened["$changeStream"]["resumeAfter"] == saved["token"]


async def inserts_after(store: JobStore, token: Any) -> list[str]:
    ids: list[str] = []
    async with await store.jobs.watch(
        [{"$match": {"operationType": "insert"}}], resume_after=token, max_await_time_ms=300
    ) as stream:
        while (change := await stream.try_next()) is not None:
            ids.append(change["documentKey"]["_id"])
    return ids


async def test_two_dispatchers_run_each_attempt_of_500_jobs_exactly_once(
    cluster: Cluster, store: JobStore
) -> None:
    cluster.dispatcher()
    cluster.dispatcher()
    await asyncio.gather(
        *[store.submit(JobSpec(task="record", payload={"n": i})) for i in range(500)]
    )
    deadline = time.monotonic() + 90
    while await store.jobs.count_documents({"status": "completed"}) < 500:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.25)
    effects = await store.db["effects"].find({}).to_list()
    assert len(effects) == 500
    assert len({(e["job_id"], e["attempt"]) for e in effects}) == 500
    assert await store.jobs.count_documents({"attempts": {"$ne": 1}}) == 0
    owners = {d["history"][1]["owner"] for d in await store.jobs.find({}).to_list()}
    assert len(owners) == 2  # both dispatchers took work


async def test_an_idle_dispatcher_keeps_a_change_stream_open_and_does_not_poll(
    cluster: Cluster, store: JobStore
) -> None:
    await store.db.command("profile", 2)
    try:
        disp = cluster.dispatcher(**SLOW_SWEEP)
        await asyncio.sleep(1.0)  # past start-up
        since = datetime.now(UTC)
        await asyncio.sleep(6.0)
        ops = (
            await store.db["system.profile"]
            .find({"ts": {"$gte": since}, "ns": f"{store.db.name}.jobs"})
            .to_list()
        )
    finally:
        await store.db.command("profile", 0)
    on_jobs = [o for o in ops if o.get("op") != "getmore"]
    getmores = [o for o in ops if o.get("op") == "getmore"]
    # No sweep is due in these 6 s: a poller, even at 1 Hz, would show here.
    assert len(on_jobs) <= 3, [(o.get("op"), o.get("command")) for o in on_jobs]
    # The change stream is open and long-polling the oplog for this collection.
    assert getmores and all(
        "$changeStream" in json.dumps(o.get("originatingCommand", {}), default=str)
        for o in getmores
    )
    assert disp.events("stream.opened")
