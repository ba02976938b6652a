"""The claimer without a database: per-queue claiming."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from common.domain.models import Job
from common.runtime.settings import Settings
from common.runtime.supervision import spawn_logged
from common.store.clock import ServerClock
from dispatcher.claimer import Claimer
from dispatcher.held_jobs import Holdings
from dispatcher.limits import Limits
from dispatcher.wiring import Wiring


def job(job_id: str, queue: str) -> Job:
    now = datetime.now(UTC)
    return Job.from_doc(
        {"_id": job_id, "task": "noop", "status": "running", "queue": queue, "run_at": now,
         "created_at": now, "attempts": 1}
    )


class FakeStore:
    def __init__(self, backlog: dict[str, list[str]]) -> None:
        self.backlog = backlog
        self.claims: list[str | None] = []

    async def claim(
        self,
        owner: str,
        lease: float,
        *,
        tasks: Collection[str],
        queue: str | None,
        **_: Any,
    ) -> Job | None:
        self.claims.append(queue)
        ids = self.backlog.get(queue or "", [])
        return job(ids.pop(0), queue or "") if ids else None

    async def claim_many(
        self,
        owner: str,
        lease: float,
        limit: int,
        *,
        tasks: Collection[str],
        queue: str | None,
        **_: Any,
    ) -> tuple[list[Job], bool]:
        got = [j for j in [await self.claim(owner, lease, tasks=tasks, queue=queue)] if j]
        return got, len(got) < limit

    async def next_due(self, **_: Any) -> None:
        return None


async def test_a_queue_that_filled_its_slots_is_claimed_again_when_one_frees_up() -> None:
    store = FakeStore({"default": ["d1", "d2", "d3"], "emails": []})
    holdings = Holdings()
    started: list[str] = []

    def start(claimed: Job) -> None:
        holdings.add(claimed)
        started.append(claimed.id)

    settings = Settings(queues="default:1,emails:2")  # type: ignore[arg-type]
    clock = ServerClock(store)  # type: ignore[arg-type]
    wiring = Wiring(
        settings=settings,
        store=store,  # type: ignore[arg-type]
        owner="me",
        name="me",
        tasks=frozenset({"noop"}),
        holdings=holdings,
        clock=clock,
        spawn=spawn_logged,
    )
    no_limits = Limits(wiring, None)  # type: ignore[arg-type]
    claimer = Claimer(wiring, start, no_limits)
    loop = asyncio.create_task(claimer.run())
    claimer.signal()
    await asyncio.sleep(0.05)
    assert started == ["d1"] and store.claims.count("emails") == 1  # emails: dry, once
    for expected in ("d2", "d3"):
        holdings.drop(started[-1])
        claimer.slot_freed()  # no new event: only a freed slot of the queue that had more
        await asyncio.sleep(0.05)
        assert started[-1] == expected
    assert store.claims.count("emails") == 1  # a dry queue is not asked again without news
    claimer.stop()
    await loop
