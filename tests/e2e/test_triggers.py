"""Triggers end to end: real dispatchers following a collection of the test's own.

`tests.tasks.triggered` declares `paid-orders`: each order inserted or updated as `paid` in
`orders` makes one `on_paid` job. Exactly one job per matching change, whichever follower
dies or steps down when.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from bson import DBRef
from pymongo import MongoClient
from pymongo.errors import BulkWriteError, PyMongoError

from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import JobStore
from brook.common.store.triggers import TriggerStore
from brook.replset import ReplicaSet
from tests.conftest import Mongo, brook_env, extra_port
from tests.e2e.conftest import Cluster, free_port
from tests.support.poison import YEAR_10000, nested, not_utf8
from tests.support.procs import BrookProcess, brook_cli, wait_until

TRIGGERED = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.triggered", "BROOK_CONCURRENCY": "1"}
NAME = "paid-orders"


async def trigger_jobs(store: JobStore) -> list[dict[str, Any]]:
    return await store.jobs.find({"trigger.name": NAME}).to_list()


async def wait_jobs(store: JobStore, n: int, timeout: float = 60) -> list[dict[str, Any]]:
    """The trigger's jobs, once there are at least `n`. Counted by the server while waiting:
    reading every job each look cost this test run more CPU than the triggers it tests."""
    deadline = time.monotonic() + timeout
    query = {"trigger.name": NAME}
    while (count := await store.jobs.count_documents(query)) < n:
        assert time.monotonic() < deadline, f"{count} trigger jobs of {n} in {timeout}s"
        await asyncio.sleep(0.2)
    return await trigger_jobs(store)


async def insert_orders(store: JobStore, start: int, count: int, chunk: int = 100) -> None:
    """Orders `start`..`start + count - 1`, even ones `paid`; through a failover (a chunk is
    sent again until every order in it is in)."""
    orders = store.db["orders"]
    for first in range(start, start + count, chunk):
        docs = [
            {"_id": n, "n": n, "status": "paid" if n % 2 == 0 else "new"}
            for n in range(first, min(first + chunk, start + count))
        ]
        while True:
            try:
                await orders.insert_many(docs, ordered=False)
                break
            except BulkWriteError as exc:
                if all(e.get("code") == 11000 for e in exc.details.get("writeErrors", [])):
                    break  # in already: a retry of a write that had landed
                raise
            except PyMongoError:
                await asyncio.sleep(0.2)


def follower_of(store_sync: MongoClient[dict[str, Any]], db: str) -> str | None:
    doc = store_sync[db]["brook_triggers"].find_one({"_id": NAME}) or {}
    follower: str | None = doc.get("follower")
    return follower


def process_of(owner: str, procs: list[BrookProcess]) -> BrookProcess:
    pid = int(owner.split(":")[-2])
    [proc] = [p for p in procs if p.pid == pid]
    return proc


def step_down(mongo: Mongo) -> None:
    rs = mongo.replset
    assert rs is not None, "needs the embedded replica set"
    old = rs.primary_index()
    assert old is not None
    direct: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{rs.ports[old]}/?directConnection=true"
    )
    with contextlib.suppress(PyMongoError):  # the stepping-down primary hangs up
        direct.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
    direct.close()
    wait_until(lambda: rs.primary_index() not in (None, old), timeout=60, interval=0.2)


def brook(settings: Settings, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return brook_cli(*args, env=brook_env(settings, BROOK_API_PORT=str(port)), timeout=30)


# Set BROOK_TEST_TRIGGER_INSERTS to run the exactly-once test at another size (the issue's
# is 10,000 inserts, half of them matching).
INSERTS = int(os.environ.get("BROOK_TEST_TRIGGER_INSERTS", "10000"))


@pytest.mark.timeout(600)
async def test_exactly_one_job_per_matching_change_through_two_follower_kills_and_a_step_down(
    cluster: Cluster, store: JobStore, settings: Settings, mongo: Mongo, http: httpx.Client
) -> None:
    cluster.api()
    procs = [cluster.dispatcher(**TRIGGERED) for _ in range(3)]
    sync: MongoClient[dict[str, Any]] = MongoClient(mongo.uri)
    owner = wait_until(lambda: follower_of(sync, settings.db))
    quarter = INSERTS // 4
    killed: list[str] = []
    try:
        for phase in range(4):
            await insert_orders(store, phase * quarter, quarter)
            if phase in (0, 2):
                # SIGKILL the follower mid-way (it has a backlog), start a replacement. The
                # second time, once another has taken over from the first one killed (until
                # its lease runs out, the trigger still names the dead one) and opened its
                # stream (killed between the two, it would have resumed nothing).
                owner = wait_until(
                    lambda: (f := follower_of(sync, settings.db)) not in killed
                    and f
                    and process_of(f, procs).events("trigger.opened")
                    and f,
                    timeout=60,
                )
                victim = process_of(owner, procs)
                victim.kill()
                killed.append(owner)
                procs.append(cluster.dispatcher(**TRIGGERED))
            elif phase == 1:
                step_down(mongo)
        jobs = await wait_jobs(store, INSERTS // 2, timeout=240)
        await asyncio.sleep(3)  # nothing more comes
        jobs = await trigger_jobs(store)
        per_order = Counter(j["payload"]["document_key"]["_id"] for j in jobs)
        twice = {n: c for n, c in per_order.items() if c > 1}
        assert twice == {}, f"orders with more than one job: {sorted(twice)[:20]}"
        assert set(per_order) == set(range(0, INSERTS, 2))  # every paid order, no other
        assert all(j["payload"]["operation"] == "insert" for j in jobs)
        assert all(j["idempotency_key"].startswith(f"trigger:{NAME}:") for j in jobs)
        # Three followers at least took it in turn; the killed ones are not the last.
        followers = {e["owner"] for p in procs for e in p.events("trigger.following")}
        assert len(followers) >= 3 and set(killed) <= followers
        # Each takeover went on from the saved token (it did not start from now).
        resumed = [e for p in procs for e in p.events("trigger.opened") if e["resumed"]]
        assert len(resumed) >= len(killed)
        [listed] = wait_until(
            lambda: [
                t
                for t in http.get("/triggers").json()["triggers"]
                if t["jobs_made"] == INSERTS // 2 and t["follower"] not in (None, *killed)
            ],
            timeout=30,
        )
        assert listed["name"] == NAME and listed["paused"] is False
        assert listed["history_lost"] == 0
        assert listed["lag_s"] is not None and listed["lag_s"] < 30
    finally:
        sync.close()


async def test_a_frozen_follower_writes_nothing_once_it_wakes_past_its_lease(
    cluster: Cluster, store: JobStore
) -> None:
    """docs/triggers.md: a follower that froze past its lease saves nothing when it wakes.
    SIGSTOP the follower in the middle of a stream of changes, let the other take over and
    make their jobs, SIGCONT it: it makes no job, saves no token and counts nothing more,
    and every change has its one job."""
    first = cluster.dispatcher(**TRIGGERED)
    first.wait_for_event("trigger.opened", timeout=30)
    second = cluster.dispatcher(**TRIGGERED)
    await insert_orders(store, 0, 40)
    first.signal(signal.SIGSTOP)  # with what it read of a stream still coming
    woke_at = None
    try:
        await insert_orders(store, 40, 60)
        taken = second.wait_for_event("trigger.following", timeout=30)
        assert taken["owner"] != first.events("trigger.following")[0]["owner"]
        await wait_jobs(store, 50)  # every paid order of the 100 so far
        triggers = store.db["brook_triggers"]
        await counted(triggers, 50)  # the new follower's save (the count moves with it)
    finally:
        first.signal(signal.SIGCONT)
        woke_at = datetime.now(UTC)
    first.wait_for_event("trigger.lease_lost", timeout=30)
    await insert_orders(store, 100, 20)
    jobs = await wait_jobs(store, 60)
    state = await triggers.find_one({"_id": NAME})
    assert state is not None and state["follower"] == taken["owner"]
    per_order = Counter(j["payload"]["document_key"]["_id"] for j in jobs)
    assert per_order == Counter(range(0, 120, 2))  # each paid order once, no other
    await counted(triggers, 60)
    # The woken one made no job: every job created after it woke is of an order written
    # after it woke (made by the new follower), and none of them is one it logged as made.
    # (A write it had sent before the freeze may be answered, and logged, after it woke.)
    assert woke_at is not None
    created_after = {j["_id"] for j in jobs if j["created_at"] > woke_at}
    assert all(j["payload"]["document_key"]["_id"] >= 100 for j in jobs if j["_id"] in created_after)
    by_it = {e["job_id"] for e in first.events("job.submitted") if e.get("trigger") == NAME}
    assert not by_it & created_after
    assert first.proc.poll() is None  # and goes on as a standby


async def counted(triggers: Any, n: int, timeout: float = 15) -> None:
    """Wait until the trigger's saved count is `n` (it never passes it: asserted)."""
    deadline = time.monotonic() + timeout
    while (state := await triggers.find_one({"_id": NAME})) is None or state["jobs_made"] != n:
        assert state is None or state["jobs_made"] < n, state["jobs_made"]
        assert time.monotonic() < deadline, None if state is None else state["jobs_made"]
        await asyncio.sleep(0.1)


async def test_a_trigger_makes_a_job_per_change_pauses_keeping_its_token_and_resumes(
    cluster: Cluster, store: JobStore, settings: Settings, http: httpx.Client
) -> None:
    cluster.api()
    first = cluster.dispatcher(**TRIGGERED)
    first.wait_for_event("trigger.opened", timeout=30)
    orders = store.db["orders"]
    await orders.insert_one({"_id": "a", "status": "paid", "n": 1})
    await orders.insert_one({"_id": "b", "status": "new", "n": 2})
    await orders.update_one({"_id": "b"}, {"$set": {"status": "paid"}})  # an update that matches
    await orders.update_one({"_id": "a"}, {"$set": {"status": "refunded"}})  # one that does not
    await orders.delete_one({"_id": "a"})  # not an operation of the trigger
    jobs = await wait_jobs(store, 2)
    by_order = {j["payload"]["document_key"]["_id"]: j for j in jobs}
    assert set(by_order) == {"a", "b"}
    a, b = by_order["a"], by_order["b"]
    assert a["task"] == "on_paid" and a["trigger"]["name"] == NAME
    assert a["payload"]["operation"] == "insert" and a["payload"]["full_document"]["n"] == 1
    assert b["payload"]["operation"] == "update"
    assert b["payload"]["update_description"]["updated_fields"] == {"status": "paid"}
    done = await wait_until_completed(store, b["_id"])
    assert done["result"] == {"operation": "update", "id": "b", "n": 2, "trigger": NAME}

    # GET /triggers and `brook triggers`: follower, lag, jobs made, paused.
    [t] = wait_until(
        lambda: [t for t in http.get("/triggers").json()["triggers"] if t["jobs_made"] == 2]
    )
    assert (t["name"], t["collection"], t["task"]) == (NAME, "orders", "on_paid")
    assert t["paused"] is False
    assert t["follower"] and t["follower"].split(":")[-2] == str(first.pid)
    assert t["match"] == {"fullDocument.status": "paid"} and t["operations"] == ["insert", "update"]
    assert t["lag_s"] is not None and t["lag_s"] < 30 and t["history_lost"] == 0
    table = brook(settings, cluster.port, "triggers")
    assert table.returncode == 0, table.stderr
    assert NAME in table.stdout and "jobs=2" in table.stdout and "active" in table.stdout

    # Paused: no job while the changes come; resumed: the jobs of every one of them.
    out = brook(settings, cluster.port, "triggers", "pause", NAME)
    assert out.returncode == 0 and '"paused": true' in out.stdout, out.stderr
    first.wait_for_event("trigger.idle", timeout=10)  # the follower has seen it
    triggers = store.db["brook_triggers"]
    before = await triggers.find_one({"_id": NAME})
    assert before is not None
    await orders.insert_many([{"_id": f"p{i}", "status": "paid", "n": i} for i in range(20)])

    async def renewed_since() -> bool:  # each renewal reads `paused` again
        doc = await triggers.find_one({"_id": NAME})
        return doc is not None and doc["lease_expires_at"] > before["lease_expires_at"]

    deadline = time.monotonic() + 10
    while not await renewed_since():
        assert time.monotonic() < deadline, "the paused follower renewed no lease"
        await asyncio.sleep(0.1)
    assert len(await trigger_jobs(store)) == 2
    listed = http.get("/triggers").json()["triggers"][0]
    assert listed["paused"] is True and listed["jobs_made"] == 2
    # The follower stops meanwhile, another dispatcher takes over from the kept token.
    assert first.stop() == 0
    second = cluster.dispatcher(**TRIGGERED)
    second.wait_for_event("trigger.following", timeout=30)
    resumed = http.post(f"/triggers/{NAME}/resume")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    jobs = await wait_jobs(store, 22)
    assert sorted(j["payload"]["document_key"]["_id"] for j in jobs) == sorted(
        ["a", "b", *(f"p{i}" for i in range(20))]
    )
    wait_until(lambda: http.get("/triggers").json()["triggers"][0]["jobs_made"] == 22)

    assert http.post("/triggers/nope/pause").status_code == 404
    missing = brook(settings, cluster.port, "triggers", "resume", "nope")
    assert missing.returncode != 0
    assert missing.stderr.strip() == "brook: error: 404 no trigger 'nope'"


async def wait_until_completed(store: JobStore, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while (doc := await store.jobs.find_one({"_id": job_id})) is None or doc[
        "status"
    ] != "completed":
        assert time.monotonic() < deadline, doc
        await asyncio.sleep(0.1)
    return doc


@pytest.mark.parametrize(
    ("module", "line"),
    [
        (
            "trigger_unknown_task",
            "brook: error: trigger 'orphan' names unknown task 'no-such-task'; known tasks: ",
        ),
        (
            "trigger_on_jobs",
            "brook: error: trigger 'loop' watches 'jobs', a collection Brook itself uses in "
            "database ",
        ),
        (
            "trigger_bad_match",
            "brook: error: BROOK_TASKS: cannot import 'tests.tasks.trigger_bad_match': trigger "
            "'bad-match': match key 'status' is not a field of the change event: a filter on "
            "the document is 'fullDocument.status'",
        ),
    ],
)
def test_a_bad_trigger_stops_the_dispatcher_with_one_line(
    settings: Settings, module: str, line: str
) -> None:
    env = brook_env(settings, BROOK_TASKS=f"tests.tasks.basic,tests.tasks.{module}")
    proc = brook_cli("dispatcher", env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(line), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""


async def fall_off_the_oplog(store: JobStore, oplog: Any) -> None:
    """Write junk until the oplog no longer holds anything written before this call."""

    async def oplog_ts(direction: int) -> Any:
        entry = await oplog.find_one({}, sort=[("$natural", direction)])
        assert entry is not None
        return entry["ts"]

    mark = await oplog_ts(-1)
    junk = store.db["junk"]
    deadline = time.monotonic() + 60
    while await oplog_ts(1) <= mark:
        assert time.monotonic() < deadline, "the oplog was never truncated"
        await junk.insert_many([{"blob": "x" * 500_000} for _ in range(4)])
        await asyncio.sleep(0.3)
    await junk.drop()


@pytest.mark.timeout(300)
async def test_a_trigger_whose_token_fell_off_the_oplog_says_so_once_and_goes_on_from_now(
    tmp_path: Any, db_name: str
) -> None:
    # A 1 MB oplog and a checkpoint every second, so the oplog really is truncated.
    rs = ReplicaSet(
        home=tmp_path / "tiny",
        base_port=extra_port("tiny_oplog"),
        members=1,
        oplog_mb=1,
        extra_args=("--syncdelay", "1"),
    )
    rs.up()
    try:
        settings = Settings(
            mongo_uri=rs.uri,
            db=db_name,
            concurrency=1,
            lease_seconds=5,
            sweep_seconds=5,
            home=tmp_path / "home",
        )
        cluster = Cluster(settings, tmp_path)
        client = make_client(settings)
        store = JobStore(database(client, settings))
        oplog = client["local"]["oplog.rs"]
        metrics_port = free_port()
        try:
            first = cluster.dispatcher(**TRIGGERED)
            first.wait_for_event("trigger.opened", timeout=30)
            await store.db["orders"].insert_one({"_id": 1, "status": "paid"})
            await wait_jobs(store, 1)
            assert first.stop() == 0
            await store.db["orders"].insert_one({"_id": 2, "status": "paid"})  # lost with the oplog
            await fall_off_the_oplog(store, oplog)
            second = cluster.dispatcher(**TRIGGERED, BROOK_METRICS_PORT=str(metrics_port))
            lost = second.wait_for_event("trigger.history_lost", timeout=30)
            assert lost["trigger"] == NAME and lost["level"] == "warning"
            state = await TriggerStore(store.db).get(NAME)
            assert state.history_lost == 1 and state.history_lost_at is not None
            assert state.to_api(state.history_lost_at)["history_lost"] == 1
            metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
            assert f'brook_trigger_history_lost_total{{trigger="{NAME}"}} 1.0' in metrics
            # From now on: a new change makes its job; the lost one never will.
            second.wait_for_event("trigger.opened", timeout=30)
            await asyncio.sleep(1)
            await store.db["orders"].insert_one({"_id": 3, "status": "paid"})
            jobs = await wait_jobs(store, 2)
            assert sorted(j["payload"]["document_key"]["_id"] for j in jobs) == [1, 3]
            assert len(second.events("trigger.history_lost")) == 1  # said once
        finally:
            cluster.close()
            await client.drop_database(db_name)
            await client.close()
    finally:
        rs.down()


def poison(tag: str) -> list[Any]:
    """Paid orders that cannot become a job: a string that is not UTF-8 (the driver cannot
    read the change), a document whose job would be nested past MongoDB's 180 levels (it
    refuses the job), one just under 16 MiB (its job would be over 16 MiB); and one not paid
    yet, `grow` makes its change."""
    return [
        not_utf8(f"{tag}-utf8"),
        {"_id": f"{tag}-deep", "status": "paid", "d": nested(179)},
        {"_id": f"{tag}-big", "status": "paid", "blob": "x" * (16 * 1024 * 1024 - 1024)},
        {"_id": f"{tag}-grow", "status": "new"},
    ]


def grow(orders: Any, tag: str) -> None:
    """An update whose change event is over 16 MiB (9 MiB set, beside the 9 MiB document):
    MongoDB 6.0 fails the stream's read of it (`BSONObjectTooLarge`) unless the trigger's
    pipeline leaves the document and the update out."""
    orders.update_one({"_id": f"{tag}-grow"}, {"$set": {"status": "paid", "blob": "y" * (9 << 20)}})


def paid(ids: range) -> list[dict[str, Any]]:
    return [{"_id": n, "n": n, "status": "paid"} for n in ids]


def listed(http: httpx.Client) -> dict[str, Any]:
    [t] = http.get("/triggers").json()["triggers"]
    return t  # type: ignore[no-any-return]


@pytest.mark.timeout(300)
async def test_poison_changes_are_skipped_once_and_stop_no_dispatcher_even_across_a_kill(
    cluster: Cluster, store: JobStore, settings: Settings, http: httpx.Client
) -> None:
    cluster.api()
    procs = [cluster.dispatcher(**TRIGGERED) for _ in range(2)]
    pids = [p.pid for p in procs]
    raw: MongoClient[dict[str, Any]] = MongoClient(settings.mongo_uri)  # the driver's defaults
    orders = raw[settings.db]["orders"]
    try:
        owner = wait_until(lambda: follower_of(raw, settings.db))
        process_of(owner, procs).wait_for_event("trigger.opened", timeout=30)
        # Between good orders: a date past year 9999 and a DBRef, which make jobs like any
        # value BSON holds, and four changes that cannot.
        for doc in [
            *paid(range(5)),
            {"_id": "date", "status": "paid", "due": YEAR_10000},
            {"_id": "ref", "status": "paid", "ref": DBRef("users", 7)},
            *poison("a"),
        ]:
            orders.insert_one(doc)
        grow(orders, "a")
        orders.insert_many(paid(range(5, 10)))
        first = wait_until(lambda: (t := listed(http))["jobs_made"] == 12 and t, timeout=60)
        assert first["skipped"] == 4, first
        assert first["last_skipped"]["operation"] == "update", first["last_skipped"]
        assert first["last_skipped"]["document_id"] == "a-grow"
        assert first["last_skipped"]["reason"].startswith("too large:"), first["last_skipped"]
        # Each skip is logged right after the write that counts it: the count can be read
        # before the last line is.
        follower = process_of(owner, procs)
        skips = wait_until(
            lambda: (found := follower.events("trigger.change_skipped"))[3:] and found,
            timeout=30,
        )
        assert [(e["document_id"], e["reason"].split(":")[0]) for e in skips] == [
            ("a-utf8", "cannot be read"),
            ("a-deep", "refused by MongoDB"),
            ("a-big", "too large"),
            ("a-grow", "too large"),
        ]
        assert all(e["trigger"] == NAME and e["change_id"] for e in skips)
        jobs = {j["payload"]["document_key"]["_id"]: j for j in await trigger_jobs(store)}
        assert set(jobs) == {*range(10), "date", "ref"}
        date_job = await wait_until_completed(store, jobs["date"]["_id"])
        assert date_job["payload"]["full_document"]["due"] == YEAR_10000
        shown = http.get(f"/jobs/{date_job['_id']}").json()
        assert shown["payload"]["full_document"]["due"] == {
            "$date": {"$numberLong": "253402300800000"}
        }
        assert (await wait_until_completed(store, jobs["ref"]["_id"]))["result"]["id"] == "ref"
        # No dispatcher stopped: the same two processes, alive, and no crash logged.
        assert [p.pid for p in procs] == pids
        assert all(p.proc.poll() is None for p in procs)
        assert not any(
            p.events("dispatcher.crashed") or p.events("background.crashed") for p in procs
        )

        # The follower is killed while it has a backlog of good and bad changes: the next one
        # goes on from the saved token. Every good change has one job, every bad one is
        # counted once.
        owner = follower_of(raw, settings.db)
        assert owner is not None
        orders.insert_many([*paid(range(100, 250)), *poison("b")])
        grow(orders, "b")
        orders.insert_many(paid(range(250, 400)))
        process_of(owner, procs).kill()
        survivor = next(p for p in procs if p.proc.poll() is None)
        done = wait_until(
            lambda: (
                (t := listed(http))["jobs_made"] == 312
                and t["follower"] is not None
                and t["follower"].split(":")[-2] == str(survivor.pid)
                and t
            ),
            timeout=90,
        )
        await asyncio.sleep(2)  # nothing more comes
        assert listed(http)["skipped"] == done["skipped"] == 8, done
        per_order = Counter(j["payload"]["document_key"]["_id"] for j in await trigger_jobs(store))
        assert {n: c for n, c in per_order.items() if c > 1} == {}
        assert set(per_order) == {*range(10), *range(100, 400), "date", "ref"}
        logged = Counter(e["change_id"] for p in procs for e in p.events("trigger.change_skipped"))
        assert {k: c for k, c in logged.items() if c > 1} == {}  # said once, if at all
        assert survivor.proc.poll() is None and survivor.pid in pids
    finally:
        raw.close()
