"""Claims for a dispatcher whose tasks share worker processes: processes and shared seats
counted apart, each claim scoped to the tasks that fit, no shared job claimed ahead."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Any

from brook.common.domain.models import Job
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import BestDue, ClaimAsk, Claimed
from brook.dispatcher.claiming.claimer import Claimer
from brook.dispatcher.claiming.holdings import Holdings
from brook.dispatcher.claiming.limits import Limits
from brook.dispatcher.hand_off import died_shared_twice
from tests.unit.dispatcher.claiming.test_claimer import ONE, FakeStore, wired


def job(job_id: str, task: str, history: list[dict[str, Any]] | None = None) -> Job:
    now = datetime.now(UTC)
    return Job.from_doc(
        {
            "_id": job_id,
            "task": task,
            "status": "running",
            "queue": "default",
            "run_at": now,
            "created_at": now,
            "attempts": 1,
            "history": history or [],
        }
    )


class ScopedStore(FakeStore):
    """Hands out jobs of the tasks each claim names, as many as it asks for."""

    def __init__(self, backlog: dict[str, int]) -> None:
        super().__init__({})
        self.left = dict(backlog)
        self.asks: list[tuple[frozenset[str], int]] = []

    async def claim(self, owner: str, lease: float, ask: ClaimAsk = ONE) -> Claimed:
        assert isinstance(ask, BestDue) and ask.tasks is not None
        self.asks.append((frozenset(ask.tasks), ask.n))
        got: list[Job] = []
        for task in sorted(ask.tasks):
            while self.left.get(task, 0) > 0 and len(got) < ask.n:
                self.left[task] -= 1
                got.append(job(f"{task}-{self.left[task]}", task))
        return Claimed(got, dry=len(got) < ask.n)


def claimer_for(store: ScopedStore, holdings: Holdings, seats: int) -> Claimer:
    wiring = dataclasses.replace(
        wired(Settings(concurrency=2), store, holdings),
        tasks=frozenset({"noop", "llm"}),
    )

    def take(claimed: Job, sent: float) -> None:
        holdings.add(claimed, sent)
        if claimed.task == "llm":  # a shared job takes its free seat at once
            holdings.start(claimed.id, shared=True)

    claimer = Claimer(wiring, take, Limits(wiring, None))  # type: ignore[arg-type]
    claimer.free_workers = lambda: 2
    claimer.room.shared = frozenset({"llm"})
    claimer.room.free_seats = lambda task: seats - holdings.active(None, lambda j: j.task == "llm")
    return claimer


async def test_shared_seats_and_processes_are_claimed_for_apart_each_with_its_own_tasks() -> None:
    store = ScopedStore({"noop": 50, "llm": 50})
    holdings = Holdings()
    holdings.record_run(2.0)  # long tasks: nothing is claimed ahead of the processes
    claimer = claimer_for(store, holdings, seats=20)
    loop = asyncio.create_task(claimer.run())
    claimer.signal()
    await asyncio.sleep(0.1)
    claimer.stop()
    await loop
    plain = [n for tasks, n in store.asks if tasks == {"noop"}]
    shared = [n for tasks, n in store.asks if tasks == {"llm"}]
    assert store.asks and all(tasks in ({"noop"}, {"llm"}) for tasks, _ in store.asks)
    assert holdings.active(None, lambda j: j.task == "noop") == 2 == sum(plain)  # its processes
    assert holdings.active(None, lambda j: j.task == "llm") == 20  # its seats, not one more
    assert sum(shared) == 20


async def test_a_shared_backlog_is_claimed_in_growing_batches_while_process_tasks_run_dry() -> None:
    """Only shared jobs are due: the claims of the tasks that take a process find nothing,
    and that must not keep the shared backlog claimed one job per round trip (the batch
    doubles while each claim fills, as without shared tasks)."""
    store = ScopedStore({"llm": 200})
    holdings = Holdings()
    claimer = claimer_for(store, holdings, seats=1000)
    loop = asyncio.create_task(claimer.run())
    claimer.signal()
    await asyncio.sleep(0.1)
    claimer.stop()
    await loop
    shared = [n for tasks, n in store.asks if tasks == {"llm"}]
    assert holdings.active(None, lambda j: j.task == "llm") == 200
    assert shared[:7] == [1, 2, 4, 8, 16, 32, 64]
    assert len(shared) <= 10, shared


def test_free_seats_are_room_for_shared_jobs_only_less_those_already_waiting() -> None:
    store = ScopedStore({})
    holdings = Holdings()
    claimer = claimer_for(store, holdings, seats=1000)
    parts = dict(claimer.room.parts(None))
    assert parts[frozenset({"llm"})] == 1000
    assert parts[frozenset({"noop"})] == 2  # the processes (no prefetch before a run)
    for n in range(10):
        holdings.add(job(f"w{n}", "llm"))  # claimed, waiting for a seat
    claimer.room.free_seats = lambda task: 1000
    assert dict(claimer.room.parts(None))[frozenset({"llm"})] == 990
    claimer.room.free_seats = lambda task: 0
    assert [tasks for tasks, _ in claimer.room.parts(None)] == [frozenset({"noop"})]


def test_without_shared_tasks_one_claim_takes_every_task() -> None:
    holdings = Holdings()
    claimer = claimer_for(ScopedStore({}), holdings, seats=10)
    claimer.room.shared = frozenset()
    assert claimer.room.parts(None) == [(None, 2)]


def test_a_job_whose_last_two_attempts_died_with_their_shared_process_runs_alone() -> None:
    died = {"status": "pending", "attempt": 1, "error": "WorkerCrashed", "shared": True}
    ran = {"status": "running", "attempt": 2}
    again = {**died, "attempt": 2}
    alone = {"status": "pending", "attempt": 3, "error": "WorkerCrashed"}
    assert not died_shared_twice(job("a", "llm", [died, ran]))
    assert died_shared_twice(job("b", "llm", [died, ran, again, {**ran, "attempt": 3}]))
    assert not died_shared_twice(job("c", "llm", [died, again, alone]))
    timed_out = {**again, "error": "Timeout"}
    assert not died_shared_twice(job("d", "llm", [died, timed_out]))


async def test_a_plain_backlog_behind_busy_processes_is_claimed_when_a_process_frees() -> None:
    """Every process busy, the shared tasks with nothing due: the look that finds the shared
    part dry must not conclude that nothing is due, or the plain jobs left behind wait for
    the next sweep once a process frees."""
    store = ScopedStore({"noop": 10})
    holdings = Holdings()
    holdings.record_run(2.0)  # long tasks: nothing is claimed ahead of the processes
    claimer = claimer_for(store, holdings, seats=20)
    loop = asyncio.create_task(claimer.run())
    claimer.signal()
    await asyncio.sleep(0.05)
    first = [j.id for j in holdings.claimed_ahead() if j.task == "noop"]
    assert len(first) == 2 and store.left["noop"] == 8
    assert any(tasks == {"llm"} for tasks, _ in store.asks)  # the shared part ran dry
    for job_id in first:  # both processes take their job, run it and are free again
        holdings.start(job_id)
        holdings.drop(job_id)
    claimer.worker_freed()
    await asyncio.sleep(0.05)
    claimer.stop()
    await loop
    assert store.left["noop"] == 6, store.asks
