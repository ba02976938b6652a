"""Claim ahead, complete behind: a real dispatcher (in process, on the test replica set) with a
runner whose tasks end when the test says so."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from brook.common.domain.models import JobSpec
from brook.common.protocol.runner import (
    KillReason,
    Outcome,
    ProgressReport,
    ReservedWorker,
    RunJob,
    StepAck,
    StepRecord,
)
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import JobStore
from brook.dispatcher.dispatcher import Dispatcher


class _Reserved(ReservedWorker):
    def __init__(self, n: int) -> None:
        self.n = n


class HeldRunner:
    """`workers` workers whose tasks run until `finish(job_id)` (or at once, with `auto`)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.busy: set[int] = set()
        self.reserved: set[int] = set()
        self.running: dict[str, asyncio.Future[Outcome]] = {}
        self.started: list[str] = []
        self.most_at_once = 0
        self.auto = False
        self.shared: Mapping[str, int] = {}
        self.on_free: Callable[[], None] = lambda: None
        self.on_progress: Callable[[ProgressReport], None] = lambda report: None
        self.on_step: Callable[[StepRecord, Callable[[StepAck], None]], None] = (
            lambda step, reply: None
        )

    async def start(self) -> None:
        return None

    async def close(self, timeout: float = 5.0) -> None:
        return None

    def free_workers(self) -> int:
        return self.workers - len(self.busy | self.reserved)

    def free_seats(self, task: str | None = None) -> int:
        return 0

    def reserve(self, shared_task: str | None = None) -> ReservedWorker | None:
        for n in range(self.workers):
            if n not in self.busy and n not in self.reserved:
                self.reserved.add(n)
                return _Reserved(n)
        return None

    def unreserve(self, reserved: ReservedWorker) -> None:
        assert isinstance(reserved, _Reserved)
        self.reserved.discard(reserved.n)

    async def run(self, reserved: ReservedWorker, job: RunJob, timeout: float | None) -> Outcome:
        assert isinstance(reserved, _Reserved)
        self.reserved.discard(reserved.n)
        self.busy.add(reserved.n)
        self.most_at_once = max(self.most_at_once, len(self.busy))
        self.started.append(job.job_id)
        done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.running[job.job_id] = done
        started = time.monotonic()
        if self.auto:
            done.set_result(Outcome(kind="ok"))
        try:
            outcome = await done
        finally:
            self.running.pop(job.job_id, None)
            self.busy.discard(reserved.n)
        # Report each task as a short one (1 ms), however long the test holds it: the
        # dispatcher then keeps claiming ahead at full depth (see `Holdings.ahead`).
        return Outcome(kind=outcome.kind, started=started, ended=started + 0.001)

    def finish(self, job_id: str, kind: Any = "ok") -> None:
        self.running[job_id].set_result(Outcome(kind=kind))

    def kill(self, job_id: str, reason: KillReason) -> bool:
        fut = self.running.get(job_id)
        if fut is None or fut.done():
            return False
        fut.set_result(Outcome(kind=reason))
        return True


async def wait_for(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def dispatcher(
    settings: Settings, store: JobStore, runner: HeldRunner
) -> AsyncIterator[tuple[Dispatcher, asyncio.Event]]:
    disp = Dispatcher(settings, store, runner, frozenset({"noop"}))
    runner.on_free = disp.wake
    stop = asyncio.Event()
    task = asyncio.create_task(disp.run(stop))
    try:
        yield disp, stop
    finally:
        stop.set()
        runner.auto = True
        for fut in list(runner.running.values()):
            if not fut.done():
                fut.set_result(Outcome(kind="ok"))
        await asyncio.wait_for(task, 30)


async def submit(store: JobStore, n: int) -> list[str]:
    return [(await store.submit(JobSpec(task="noop", payload={}))).job.id for _ in range(n)]


async def counts(store: JobStore) -> dict[str, int]:
    running = await store.jobs.count_documents({"status": "running"})
    started = await store.jobs.count_documents({"status": "running", "started_at": {"$ne": None}})
    return {"running": running, "started": started}


async def _eq(store: JobStore, expected: dict[str, int]) -> bool:
    return await counts(store) == expected


async def count_is(store: JobStore, query: dict[str, Any], n: int) -> bool:
    return await store.jobs.count_documents(query) == n


async def warm_up(store: JobStore, runner: HeldRunner) -> None:
    """Two quick tasks: the dispatcher learns its tasks are short, and claims ahead."""
    runner.auto = True
    ids = await submit(store, 2)
    await wait_for(lambda: count_is(store, {"_id": {"$in": ids}, "status": "completed"}, 2))
    runner.auto = False


async def shown_started_are_running(store: JobStore, runner: HeldRunner) -> bool:
    """The jobs whose start is written and that are still `running` are exactly the two
    whose tasks run now."""
    now = set(runner.running)
    shown = await store.jobs.find(
        {"status": "running", "started_at": {"$ne": None}}, projection={"_id": 1}
    ).to_list()
    return len(now) == 2 and {d["_id"] for d in shown} == now


async def held(store: JobStore) -> int:
    return await store.jobs.count_documents({"status": "running"})


async def test_a_dispatcher_holds_its_workers_plus_prefetch_leases_and_runs_no_more_than_its_workers(
    settings: Settings, store: JobStore
) -> None:
    settings = settings.model_copy(update={"prefetch": 3})
    runner = HeldRunner(2)
    async with dispatcher(settings, store, runner):
        await warm_up(store, runner)
        await submit(store, 20)
        # 2 running, and 2 or 3 claimed ahead (it refills when half the prefetch is free):
        # leased (`running`), never started (`started_at` null). The two whose tasks run
        # show a start: written after MARK_AFTER_S, as they run long.
        await wait_for(lambda: len(runner.running) == 2)
        await wait_for(lambda: _at_least(store, 4))
        for _ in range(3):
            # The two whose tasks run now show their start, and only they: the pair finished
            # before has its completion written (until then it still counts as running).
            await wait_for(lambda: shown_started_are_running(store, runner))
            assert await held(store) <= 5
            ahead = await store.jobs.find({"status": "running", "started_at": None}).to_list()
            assert ahead and {d["_id"] for d in ahead}.isdisjoint(runner.started)
            first = set(runner.running)
            before = datetime.now(UTC)
            for job_id in first:
                runner.finish(job_id)
            # A freed worker takes a job already claimed: no claim round trip in between.
            await wait_for(lambda f=first: len(runner.running) >= 1 and not f & set(runner.running))  # type: ignore[misc]
            for job_id in list(runner.running):
                claimed_at = (await store.get(job_id)).history[-1]["at"]
                assert claimed_at <= before, (claimed_at, before)
        runner.auto = True
        for job_id in list(runner.running):
            runner.finish(job_id)
        await wait_for(lambda: count_is(store, {"status": "completed"}, 22))
    assert runner.most_at_once == 2
    for doc in await store.jobs.find({}).to_list():
        assert doc["attempts"] == 1 and doc["started_at"] <= doc["finished_at"]


async def claimed_ahead(store: JobStore, ids: list[str], runner: HeldRunner) -> list[str]:
    """Jobs leased (`running`) whose task has not started."""
    await wait_for(lambda: len(runner.running) == 2)
    docs = await wait_for(
        lambda: store.jobs.find({"_id": {"$in": ids}, "status": "running"}).to_list()
    )
    await wait_for(lambda: count_is(store, {"status": "running"}, len(docs)))
    return [d["_id"] for d in docs if d["_id"] not in runner.running]


async def test_jobs_claimed_ahead_are_handed_back_at_once_on_shutdown(
    settings: Settings, store: JobStore
) -> None:
    settings = settings.model_copy(update={"prefetch": 3, "shutdown_grace_seconds": 30.0})
    runner = HeldRunner(2)
    async with dispatcher(settings, store, runner) as (_, stop):
        await warm_up(store, runner)
        ids = await submit(store, 5)
        await wait_for(lambda: _at_least(store, 4))
        ahead = await claimed_ahead(store, ids, runner)
        assert len(ahead) >= 2
        stop.set()
        # Within the grace period (the two running tasks go on), those never started are
        # pending again, their attempt not counted.
        back = {"_id": {"$in": ahead}, "status": "pending", "attempts": 0, "started_at": None}
        await wait_for(lambda: count_is(store, back, len(ahead)), timeout=5)
        assert len(runner.running) == 2
        for job_id in list(runner.running):
            runner.finish(job_id)
    for doc in await store.jobs.find({"_id": {"$in": ahead}}).to_list():
        assert doc["history"][-1]["reason"] == "released"
        assert doc["_id"] not in runner.started


async def _at_least(store: JobStore, n: int) -> bool:
    return await held(store) >= n


async def test_a_job_cancelled_while_claimed_ahead_never_starts(
    settings: Settings, store: JobStore
) -> None:
    settings = settings.model_copy(update={"prefetch": 3})
    runner = HeldRunner(2)
    async with dispatcher(settings, store, runner):
        await warm_up(store, runner)
        ids = await submit(store, 5)
        await wait_for(lambda: _at_least(store, 4))
        ahead = await claimed_ahead(store, ids, runner)
        cancelled = await store.cancel(ahead[0])
        assert cancelled.cancel_requested
        done = await wait_for(
            lambda: store.jobs.find_one({"_id": ahead[0], "status": "cancelled"}), timeout=5
        )
        assert done["started_at"] is None and done["error"]["type"] == "Cancelled"
        runner.auto = True
        for job_id in list(runner.running):
            runner.finish(job_id)
        await wait_for(lambda: count_is(store, {"status": "completed"}, 6))
    assert ahead[0] not in runner.started


async def test_a_job_whose_lease_is_lost_while_claimed_ahead_is_dropped_unstarted(
    settings: Settings, store: JobStore
) -> None:
    settings = settings.model_copy(update={"prefetch": 3})
    runner = HeldRunner(2)
    async with dispatcher(settings, store, runner):
        await warm_up(store, runner)
        ids = await submit(store, 5)
        await wait_for(lambda: _at_least(store, 4))
        ahead = await claimed_ahead(store, ids, runner)
        # Another owner holds it now (as after a frozen dispatcher's lease expired): the
        # heartbeat's renewal misses it, and the job leaves the buffer without starting.
        await store.jobs.update_one({"_id": ahead[0]}, {"$set": {"owner": "someone-else"}})
        await asyncio.sleep(settings.heartbeat_seconds * 1.5)
        runner.auto = True
        for job_id in list(runner.running):
            runner.finish(job_id)
        others = [i for i in ids if i != ahead[0]]
        await wait_for(lambda: count_is(store, {"_id": {"$in": others}, "status": "completed"}, 4))
    assert ahead[0] not in runner.started
    assert (await store.get(ahead[0])).owner == "someone-else"


async def test_a_job_that_outranks_the_jobs_claimed_last_is_claimed_beside_the_claim_in_flight(
    settings: Settings, store: JobStore
) -> None:
    """Under a backlog the buffer is often empty while its refill is in flight: a job that
    outranks the jobs claimed last does not wait for that claim's answer."""
    runner = HeldRunner(2)
    app = "brook-test-dispatcher"
    client = make_client(settings, appname=app)
    admin = store.jobs.database.client.admin
    try:
        async with dispatcher(settings, JobStore(database(client, settings)), runner):
            await warm_up(store, runner)  # two jobs of priority 0 claimed last
            # The dispatcher's next single-job claim is held on the server for 3 s.
            held = await admin.command(
                "configureFailPoint",
                "failCommand",
                mode={"times": 1},
                data={
                    "failCommands": ["findAndModify"],
                    "appName": f"{app}:{os.getpid()}",
                    "blockConnection": True,
                    "blockTimeMS": 3000,
                },
            )
            low = (await store.submit(JobSpec(task="noop", payload={}))).job.id
            await admin.command(
                "waitForFailPoint", "failCommand", timesEntered=held["count"] + 1, maxTimeMS=10_000
            )
            urgent = (await store.submit(JobSpec(task="noop", payload={}, priority=5))).job.id
            await wait_for(lambda: urgent in runner.started, timeout=1.5)
            # The held claim has not landed yet: the urgent job was claimed beside it.
            assert (await store.get(low)).status == "pending"
            runner.auto = True
            for job_id in list(runner.running):
                runner.finish(job_id)
            await wait_for(lambda: count_is(store, {"status": "completed"}, 4), timeout=10)
    finally:
        await admin.command("configureFailPoint", "failCommand", mode="off")
        await client.close()


async def test_a_job_that_outranks_all_claimed_ahead_starts_next(
    settings: Settings, store: JobStore
) -> None:
    settings = settings.model_copy(update={"prefetch": 8})
    runner = HeldRunner(2)
    async with dispatcher(settings, store, runner) as (disp, _):
        await warm_up(store, runner)
        await submit(store, 30)
        await wait_for(lambda: _at_least(store, 6))
        urgent = (await store.submit(JobSpec(task="noop", payload={}, priority=5))).job.id
        # Held by the dispatcher (its claim's answer is back), not only `running` in
        # MongoDB: a worker freed before the answer takes the best job held then.
        await wait_for(lambda: disp.holdings.job(urgent) is not None)
        # Claimed while the buffer held lower jobs: the first worker to free takes it.
        for job_id in list(runner.running)[:1]:
            runner.finish(job_id)
        await wait_for(lambda: urgent in runner.running)
        assert await held(store) <= 2 + 8 + 1
    assert runner.most_at_once == 2
