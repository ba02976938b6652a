"""Cluster-wide queue limits with real dispatchers: concurrency, rate and pause hold across
every dispatcher, measured from the server's own timestamps (each attempt's history), and
nothing a dead dispatcher held is lost or counted twice."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx

from brook.common.domain.status import JobStatus
from brook.common.store.jobs import JobStore
from brook.common.store.queues import QueueStore
from tests.e2e.conftest import JSON, Cluster
from tests.e2e.test_faults import all_logs, submit, wait_all_terminal
from tests.support.checker import check_history, settled_logs
from tests.support.limits import attempts, max_overlap, max_starts_in_window, runs
from tests.support.procs import BrookProcess, wait_until


async def queue_jobs(store: JobStore, queue: str) -> list[dict[str, Any]]:
    return await store.jobs.find({"queue": queue}).to_list()


async def wait_slots_free(store: JobStore, queue: str, timeout: float = 30) -> None:
    """Every slot of the queue given back (releases follow the final writes), in
    `brook_queues` and on the jobs (`key_slot`)."""
    queues = QueueStore(store.db)
    deadline = time.monotonic() + timeout
    while True:
        doc = await queues.read(queue)
        assert doc is not None
        if not doc.slots and (await queues.usage())[queue].in_use == 0:
            return
        assert time.monotonic() < deadline, f"slots left in {queue}: {doc}"
        await asyncio.sleep(0.1)


TASKS = "tests.tasks.basic,tests.tasks.limits"


def claims_by(*procs: BrookProcess) -> list[int]:
    return [len(p.events("job.claimed")) for p in procs]


# -- concurrency -------------------------------------------------------------------------------


async def test_three_dispatchers_never_run_more_than_three_jobs_of_a_queue_limited_to_three(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api()
    put = http.put("/queues/fragile", json={"concurrency": 3})
    assert put.status_code == 200, put.text
    assert put.json()["concurrency"] == 3 and put.json()["slots_in_use"] == 0
    dispatchers = [cluster.dispatcher(BROOK_CONCURRENCY="4") for _ in range(3)]
    ids = await submit(store, "sleep", 300, queue="fragile", payload={"seconds": 0.02})
    others = await submit(store, "noop", 40)  # an unlimited queue, alongside
    await wait_all_terminal(store, 340, timeout=150)
    docs = await queue_jobs(store, "fragile")
    spans = attempts(docs)
    assert len(spans) >= 300
    assert max_overlap(spans) == 3  # never more, and the limit was reached
    # The same read off the tasks' own start and end times.
    assert len(runs(docs)) == 300 and max_overlap(runs(docs)) <= 3
    assert all(n > 0 for n in claims_by(*dispatchers))  # every dispatcher took its share
    await wait_slots_free(store, "fragile")
    def fragile() -> dict[str, Any]:
        [queue] = [q for q in http.get("/queues").json()["queues"] if q["name"] == "fragile"]
        return dict(queue)

    # Job counts are kept in memory, recounted every BROOK_METRICS_CACHE_SECONDS (2 s).
    wait_until(lambda: fragile()["counts"]["completed"] == 300, timeout=10)
    assert fragile()["slots_in_use"] == 0
    report = await check_history(
        store, ids + others, await settled_logs(store, lambda: all_logs(*dispatchers))
    )
    assert report.problems == []


# -- rate --------------------------------------------------------------------------------------


async def test_a_rate_of_20_per_2_seconds_holds_in_every_window_without_busy_waiting(
    cluster: Cluster, store: JobStore
) -> None:
    await QueueStore(store.db).set_limits("rated", {"rate": {"limit": 20, "per_seconds": 2}})
    dispatchers = [cluster.dispatcher(BROOK_CONCURRENCY="4") for _ in range(2)]
    before = await queue_ops(store)
    ids = await submit(store, "noop", 80, queue="rated")
    await wait_all_terminal(store, 80, timeout=90)
    docs = await queue_jobs(store, "rated")
    claims = [a.start for a in attempts(docs)]  # a job handed back unstarted is claimed again
    assert len(claims) >= 80
    assert max_starts_in_window(claims, 2.0) <= 20
    # The tasks' real starts hold the rate too (claims are counted over a slightly longer
    # window, and a claimed job starts within that margin or is handed back).
    starts = [r.start for r in runs(docs)]
    assert len(starts) == 80
    assert max_starts_in_window(starts, 2.0) <= 20
    # 80 starts at 20 per 2 s: the last of them at least 6 s after the first.
    assert (max(starts) - min(starts)).total_seconds() >= 6.0
    # Waiting for the next window costs a timer, not a loop: a few writes and reads of the
    # queue's document per job (its slot, the settle of the starts, the release, a refused
    # try), not thousands.
    ops = await queue_ops(store) - before
    assert ops < 80 * 6, ops
    await wait_slots_free(store, "rated")
    report = await check_history(
        store, ids, await settled_logs(store, lambda: all_logs(*dispatchers))
    )
    assert report.problems == []


async def queue_ops(store: JobStore) -> int:
    """Operations the server ran on `brook_queues` so far (the `top` command's count)."""
    top = await store.db.client.admin.command("top")
    stats = top["totals"].get(f"{store.db.name}.brook_queues", {})
    count = {k: int(v.get("count", 0)) for k, v in stats.items() if isinstance(v, dict)}
    # Commands, queries and writes; not the change streams' getMores (one per event).
    return count.get("total", 0) - count.get("getmore", 0)


# -- pause -------------------------------------------------------------------------------------


async def test_pause_starts_nothing_new_lets_running_jobs_finish_and_resume_restarts(
    cluster: Cluster, store: JobStore
) -> None:
    cluster.api()
    disp = cluster.dispatcher(BROOK_CONCURRENCY="4")
    first = await submit(store, "sleep", 2, queue="batch", payload={"seconds": 2})
    wait_until(lambda: len(disp.events("task.started")) == 2, timeout=20)
    paused = cluster.cli("queue", "pause", "batch")
    assert paused.returncode == 0, paused.stderr
    queues = QueueStore(store.db)
    paused_at = await updated_at(queues, "batch")
    later = await submit(store, "sleep", 3, queue="batch", payload={"seconds": 0.1})
    await wait_all_terminal(store, 2, timeout=20)  # the running jobs finish
    await asyncio.sleep(1.5)  # and nothing new starts, though workers are free
    assert [(await store.get(j)).status for j in later] == ["pending"] * 3
    listed = cluster.cli("queue", "ls")
    assert "paused" in listed.stdout and "batch" in listed.stdout
    resumed = cluster.cli("queue", "resume", "batch")
    assert resumed.returncode == 0, resumed.stderr
    resumed_at = await updated_at(queues, "batch")
    await wait_all_terminal(store, 5, timeout=20)  # resume wakes the dispatcher at once
    spans = attempts(await queue_jobs(store, "batch"))
    assert not [a for a in spans if paused_at <= a.start < resumed_at]
    assert min(a.start for a in spans if a.job_id in later) >= resumed_at
    report = await check_history(store, first + later, await settled_logs(store, disp.logs))
    assert report.problems == []


async def updated_at(queues: QueueStore, name: str) -> Any:
    doc = await queues.queues.find_one({"_id": name})
    assert doc is not None
    return doc["updated_at"]


# -- dead dispatchers --------------------------------------------------------------------------


def owner_of(proc: BrookProcess) -> str:
    return str(proc.events("dispatcher.started")[0]["owner"])


def reclaimed(proc: BrookProcess) -> list[dict[str, Any]]:
    return proc.events("slots.reclaimed")


async def test_a_sigkilled_dispatchers_slots_come_back_when_its_leases_expire(
    cluster: Cluster, store: JobStore
) -> None:
    await QueueStore(store.db).set_limits("fragile", {"concurrency": 2})
    # A 10 s lease: A must hold both slots until it is killed, and on a loaded machine a
    # few seconds without a renewal made it fence itself and hand them back before (CI).
    lease = {"BROOK_LEASE_SECONDS": "10"}
    a = cluster.dispatcher(BROOK_CONCURRENCY="4", BROOK_TASKS=TASKS, **lease)
    held = await submit(store, "slow_first", 2, queue="fragile", payload={"first": 120})
    wait_until(lambda: len(a.events("task.started")) == 2, timeout=20)
    b = cluster.dispatcher(BROOK_CONCURRENCY="4", BROOK_TASKS=TASKS, **lease)
    waiting = await submit(store, "record", 4, queue="fragile", payload={"seconds": 0.2})
    await asyncio.sleep(1.0)
    assert not b.events("job.claimed")  # free workers, but the queue is full
    workers = a.children()
    a.kill()  # SIGKILL while holding both slots: no final write, no release
    await wait_all_terminal(store, 6, timeout=90)
    expired = b.events("lease.expired")
    assert sorted(e["job_id"] for e in expired) == sorted(held)
    assert {e["owner"] for e in expired} == {owner_of(a)}
    assert reclaimed(b), "B freed the dead dispatcher's slots"
    spans = attempts(await queue_jobs(store, "fragile"))
    assert max_overlap(spans) == 2  # the killed attempts count until their lease expired
    for job_id in held:  # each ran again, on B, only after A's attempt was requeued
        first, second = sorted((a for a in spans if a.job_id == job_id), key=lambda a: a.start)
        assert first.end is not None and second.start >= first.end
    await wait_slots_free(store, "fragile")
    report = await check_history(
        store, held + waiting, await settled_logs(store, lambda: all_logs(a, b)), effects=True
    )
    assert report.problems == [] and report.by_status() == {"completed": 6}
    assert not any(p in workers for p in a.children())


async def test_a_dispatcher_killed_between_taking_its_slot_and_claiming_leaks_nothing(
    cluster: Cluster, store: JobStore
) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 1})
    a = cluster.dispatcher()
    admin = store.db.client.admin
    app = f"brook-dispatcher:{a.pid}"
    # A, idle, sends no findAndModify. For its next claim, the first one (taking the slot)
    # goes through; the second (the claim itself) is held by the server, and A is killed
    # meanwhile: its slot is written, its claim lands after its death or never.
    await admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"skip": 1},
        data={
            "failCommands": ["findAndModify"],
            "blockConnection": True,
            "blockTimeMS": 3000,
            "appName": app,
        },
    )
    try:
        [job_id] = await submit(store, "record", queue="fragile")
        await wait_blocked(store, app, "jobs")
        a.kill()
        doc = await queues.read("fragile")
    finally:
        await admin.command("configureFailPoint", "failCommand", mode="off")
    assert doc is not None
    [slot] = doc.slots
    assert slot.owner == owner_of(a) and slot.job == job_id and slot.claim_by is not None
    b = cluster.dispatcher()
    await wait_all_terminal(store, 1, timeout=60)
    job = await store.get(job_id)
    assert job.status == "completed" and job.started_at is not None
    # Whether A's claim landed (then its lease expired: a second attempt) or not, the slot
    # it took counted until its claim_by, and B freed it.
    assert job.attempts in (1, 2) and job.started_at >= slot.claim_by
    freed = reclaimed(b)
    assert freed and freed[0]["owners"] == [owner_of(a)] and freed[0]["jobs"] == [job_id]
    assert max_overlap(attempts(await queue_jobs(store, "fragile"))) == 1
    await wait_slots_free(store, "fragile")
    report = await check_history(
        store, [job_id], await settled_logs(store, lambda: all_logs(a, b)), effects=True
    )
    assert report.problems == []


async def wait_blocked(store: JobStore, app: str, collection: str, timeout: float = 20) -> None:
    """Until the server holds `app`'s findAndModify on `collection` (the fail point). A
    large command shows in `currentOp` as a truncated string."""
    deadline = time.monotonic() + timeout
    while True:
        ops = await store.db.client.admin.command({"currentOp": 1, "appName": app})
        for op in ops["inprog"]:
            command = op.get("command", {})
            shown = command.get("$truncated") or ""
            if command.get("findAndModify") == collection or shown.startswith(
                f'{{ findAndModify: "{collection}"'
            ):
                return
        assert time.monotonic() < deadline, f"{app} never sent its findAndModify"
        await asyncio.sleep(0.05)


async def test_a_dispatcher_killed_after_claiming_before_its_worker_started_leaks_nothing(
    cluster: Cluster, store: JobStore
) -> None:
    import os
    import signal

    await QueueStore(store.db).set_limits("fragile", {"concurrency": 1})
    a = cluster.dispatcher(BROOK_CONCURRENCY="1")
    workers = a.children()
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)  # the job is claimed and sent, but no task starts
    try:
        [job_id] = await submit(store, "record", queue="fragile")
        await wait_status(store, job_id, "running")
        await asyncio.sleep(0.5)
        assert not a.events("task.started")
        a.kill()
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    b = cluster.dispatcher()
    await wait_all_terminal(store, 1, timeout=60)
    job = await store.get(job_id)
    assert job.status == "completed" and job.attempts == 2
    assert [h["status"] for h in job.history] == [
        "pending",
        "running",
        "pending",
        "running",
        "completed",
    ]
    assert reclaimed(b)
    assert max_overlap(attempts(await queue_jobs(store, "fragile"))) == 1
    await wait_slots_free(store, "fragile")
    report = await check_history(
        store, [job_id], await settled_logs(store, lambda: all_logs(a, b)), effects=True
    )
    assert report.problems == []


async def wait_status(store: JobStore, job_id: str, status: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (await store.get(job_id)).status != status:
        assert time.monotonic() < deadline, f"{job_id} never became {status}"
        await asyncio.sleep(0.05)


# -- failover ----------------------------------------------------------------------------------


async def test_a_step_down_under_load_does_not_let_a_queue_exceed_its_concurrency(
    cluster: Cluster, store: JobStore, mongo: Any
) -> None:
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    rs = mongo.replset
    assert rs is not None, "needs the embedded replica set"
    await QueueStore(store.db).set_limits("fragile", {"concurrency": 3})
    dispatchers = [cluster.dispatcher(BROOK_CONCURRENCY="3") for _ in range(3)]
    ids = await submit(store, "record", 150, queue="fragile", payload={"seconds": 0.05})
    wait_until(lambda: sum(claims_by(*dispatchers)) >= 40, timeout=60)
    old = rs.primary_index()
    direct: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{rs.ports[old]}/?directConnection=true"
    )
    with contextlib.suppress(PyMongoError):  # the stepping-down primary hangs up
        direct.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
    direct.close()
    wait_until(lambda: rs.primary_index() not in (None, old), timeout=60, interval=0.2)
    await wait_all_terminal(store, 150, timeout=150)
    spans = attempts(await queue_jobs(store, "fragile"))
    assert max_overlap(spans) <= 3
    await wait_slots_free(store, "fragile", timeout=60)
    report = await check_history(
        store, ids, await settled_logs(store, lambda: all_logs(*dispatchers)), effects=True
    )
    assert report.problems == []


# -- the API, the CLI and the Python client ---------------------------------------------------

BAD_BODIES: list[Any] = [
    {"concurrency": 0},
    {"concurrency": -1},
    {"concurrency": "3"},
    {"concurrency": True},
    {"concurrency": 1.5},
    {"concurrency": 10**9},
    {"rate": {"limit": 0, "per_seconds": 1}},
    {"rate": {"limit": 5}},
    {"rate": {"limit": 5, "per_seconds": 0}},
    {"rate": {"limit": 5, "per_seconds": -1}},
    {"rate": {"limit": 5, "per_seconds": "2"}},
    {"rate": {"limit": 5.5, "per_seconds": 2}},
    {"rate": {"limit": 5, "per_seconds": 2, "burst": 3}},
    {"rate": 20},
    {"paused": "yes"},
    {"paused": None},
    {"paused": 1},
    {"priority": 3},
    [1, 2],
]


async def test_put_queue_refuses_bad_input_with_422_and_changes_nothing(
    cluster: Cluster, http: httpx.Client, store: JobStore, settings: Any
) -> None:
    from brook import Client, InvalidInput

    cluster.api()
    assert http.put("/queues/q", json={"concurrency": 2}).status_code == 200
    before = await QueueStore(store.db).queues.find_one({"_id": "q"})
    with Client(settings.mongo_uri, settings.db) as client:
        for body in BAD_BODIES:
            resp = http.put("/queues/q", json=body)
            assert resp.status_code == 422, (body, resp.text)
            if isinstance(body, dict):
                try:
                    client.set_queue("q", body)
                except InvalidInput as exc:
                    assert exc.detail == resp.json()["detail"], body  # the same words
                else:
                    raise AssertionError(f"the client accepted {body}")
    for name in ("no spaces", "a" * 65, "-dash-first"):
        assert http.put(f"/queues/{name}", json={"paused": True}).status_code == 422
    assert http.put("/queues/q", content=b"{not json", headers=JSON).status_code == 422
    assert http.put("/queues/q", json={"paused": True, "x": "y" * 1_100_000}).status_code == 413
    assert await QueueStore(store.db).queues.find_one({"_id": "q"}) == before
    assert await QueueStore(store.db).queues.count_documents({}) == 1


async def test_put_queue_changes_only_what_it_names_and_get_shows_it(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api()
    rate = {"limit": 20, "per_seconds": 2.0}
    q = http.put("/queues/emails", json={"concurrency": 3, "rate": rate}).json()
    assert (q["concurrency"], q["rate"], q["paused"]) == (3, rate, False)
    assert q["slots_in_use"] == 0 and q["starts_in_window"] == 0
    assert set(q["counts"]) == {s.value for s in JobStatus} and not any(q["counts"].values())
    q = http.put("/queues/emails", json={"paused": True}).json()
    assert (q["concurrency"], q["rate"], q["paused"]) == (3, rate, True)
    q = http.put("/queues/emails", json={"concurrency": None}).json()
    assert (q["concurrency"], q["rate"], q["paused"]) == (None, rate, True)
    q = http.put("/queues/emails", json={}).json()
    assert (q["concurrency"], q["rate"], q["paused"]) == (None, rate, True)
    q = http.put("/queues/emails", json={"rate": None, "paused": False}).json()
    assert (q["concurrency"], q["rate"], q["paused"]) == (None, None, False)
    assert q["slots_in_use"] is None  # no limits: no slots
    listed = {x["name"]: x for x in http.get("/queues").json()["queues"]}
    assert listed["emails"] == q  # a queue with no job is listed once it was given limits
    put = http.get("/openapi.json").json()["paths"]["/queues/{name}"]["put"]
    schema = put["requestBody"]["content"]["application/json"]["schema"]
    assert schema["title"] == "QueueUpdate"
    assert set(schema["properties"]) == {
        "concurrency",
        "rate",
        "paused",
        "key_concurrency",
        "key_rate",
        "fair",
    }


async def test_the_cli_sets_shows_pauses_resumes_and_clears_limits(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api()
    out = cluster.cli("queue", "set", "emails", "--concurrency", "2", "--rate", "10/1s")
    assert out.returncode == 0, out.stderr
    listed = cluster.cli("queue", "ls").stdout
    assert "concurrency=2 (0 in use) rate=10/1s" in listed
    assert cluster.cli("queue", "pause", "emails").returncode == 0
    assert "paused" in cluster.cli("queue", "ls").stdout
    assert cluster.cli("queue", "resume", "emails").returncode == 0
    out = cluster.cli("queue", "set", "emails", "--concurrency", "none", "--rate", "none")
    assert out.returncode == 0, out.stderr
    [emails] = [q for q in http.get("/queues").json()["queues"] if q["name"] == "emails"]
    assert (emails["concurrency"], emails["rate"], emails["paused"]) == (None, None, False)
    for bad in (
        ["set", "emails"],
        ["set", "emails", "--rate", "ten"],
        ["set", "emails", "--concurrency", "0"],
    ):
        out = cluster.cli("queue", *bad)
        assert out.returncode == 2 and out.stderr.count("\n") <= 2, out.stderr
    out = cluster.cli("queue", "set", "bad name", "--concurrency", "1")
    assert out.returncode == 1 and out.stderr.startswith("brook: error: 422")
