"""The claimer without a database: per-queue claiming."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from brook.common.domain.models import Job
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import spawn_logged
from brook.common.store.clock import ServerClock
from brook.common.store.jobs import BestDue, ClaimAsk, Claimed
from brook.dispatcher.attempts.leases import LeaseKeeper
from brook.dispatcher.claiming.claimer import Claimer
from brook.dispatcher.claiming.holdings import Holdings
from brook.dispatcher.claiming.limits import Limits
from brook.dispatcher.wiring import Wiring


def job(job_id: str, queue: str) -> Job:
    now = datetime.now(UTC)
    return Job.from_doc(
        {
            "_id": job_id,
            "task": "noop",
            "status": "running",
            "queue": queue,
            "run_at": now,
            "created_at": now,
            "attempts": 1,
        }
    )


ONE = BestDue()


class FakeStore:
    def __init__(self, backlog: dict[str, list[str]]) -> None:
        self.backlog = backlog
        self.claims: list[str | None] = []

    async def claim(self, owner: str, lease: float, ask: ClaimAsk = ONE) -> Claimed:
        """One job at most per claim, whatever it asks for."""
        assert isinstance(ask, BestDue)
        self.claims.append(ask.queue)
        ids = self.backlog.get(ask.queue or "", [])
        got = [job(ids.pop(0), ask.queue or "")] if ids else []
        return Claimed(got, dry=len(got) < ask.n)

    async def next_due(self, **_: Any) -> None:
        return None


def wired(settings: Settings, store: FakeStore, holdings: Holdings) -> Wiring:
    """A dispatcher's shared parts around a fake store, for a claimer without a database."""
    return Wiring(
        settings=settings,
        store=store,  # type: ignore[arg-type]
        owner="me",
        name="me",
        tasks=frozenset({"noop"}),
        holdings=holdings,
        clock=ServerClock(store),  # type: ignore[arg-type]
        spawn=spawn_logged,
    )


async def test_a_queue_that_filled_its_slots_is_claimed_again_when_one_frees_up() -> None:
    store = FakeStore({"default": ["d1", "d2", "d3"], "emails": []})
    holdings = Holdings()
    started: list[str] = []

    def start(claimed: Job, sent: float) -> None:
        holdings.add(claimed, sent)
        started.append(claimed.id)

    wiring = wired(Settings(queues="default:1,emails:2"), store, holdings)  # type: ignore[arg-type]
    no_limits = Limits(wiring, None)  # type: ignore[arg-type]
    claimer = Claimer(wiring, start, no_limits)
    loop = asyncio.create_task(claimer.run())
    claimer.signal()
    await asyncio.sleep(0.05)
    assert started == ["d1"] and store.claims.count("emails") == 1  # emails: dry, once
    for expected in ("d2", "d3"):
        holdings.drop(started[-1])
        claimer.worker_freed()  # no new event: only a freed worker of the queue that had more
        await asyncio.sleep(0.05)
        assert started[-1] == expected
    assert store.claims.count("emails") == 1  # a dry queue is not asked again without news
    claimer.stop()
    await loop


class SlowAnswerStore(FakeStore):
    """A claim the server applies at once, whose answer comes back `delay` later (a
    failover's majority commit, say)."""

    def __init__(self, backlog: dict[str, list[str]], delay: float) -> None:
        super().__init__(backlog)
        self.delay = delay
        self.applied: list[float] = []

    async def claim(self, owner: str, lease: float, ask: ClaimAsk = ONE) -> Claimed:
        self.applied.append(time.monotonic())
        await asyncio.sleep(self.delay)
        return await super().claim(owner, lease, ask)


async def test_a_lease_whose_claim_answered_late_is_fenced_from_when_the_claim_was_sent() -> None:
    store = SlowAnswerStore({"": ["j1"]}, delay=0.7)  # every queue
    holdings = Holdings()
    answered: list[float] = []
    started = asyncio.Event()

    def start(claimed: Job, sent: float) -> None:
        holdings.add(claimed, sent)
        answered.append(time.monotonic())
        started.set()

    settings = Settings(lease_seconds=2.0)
    wiring = wired(settings, store, holdings)
    claimer = Claimer(wiring, start, Limits(wiring, None))  # type: ignore[arg-type]
    loop = asyncio.create_task(claimer.run())
    claimer.signal()
    await asyncio.wait_for(started.wait(), 5)
    claimer.stop()
    await loop
    # The server's lease ran from when it applied the claim, 0.7 s before the answer: the
    # self-fence counts from the send, never from the answer.
    assert holdings.lease_since("j1") <= store.applied[0] <= answered[0] - 0.7
    keeper = LeaseKeeper(wiring, lambda job_id, reason: True)
    lease = holdings.lease("j1")
    assert lease is not None
    assert keeper._expires_at(lease) < store.applied[0] + settings.lease_seconds


async def test_a_job_of_a_queue_with_nothing_held_here_is_claimed_first_and_from_its_queue() -> (
    None
):
    """Without BROOK_QUEUES the queues share the workers: while a limited queue's backlog
    fills the buffer, the first job of another queue is urgent for its own target (the
    queues without limits: None), not for whichever target a look would try first."""
    store = FakeStore({})
    holdings = Holdings()
    wiring = wired(Settings(), store, holdings)
    limits = Limits(wiring, None)  # type: ignore[arg-type]
    limits._limited = frozenset({"bulk"})  # a queue with limits, as a refresh would see it
    claimer = Claimer(wiring, lambda claimed, sent: None, limits)
    claimer.due_at(None, 0, "default")
    assert claimer._urgent == {}  # nothing held: the next look claims it anyway
    holdings.add(job("b1", "bulk"))
    claimer.due_at(None, 0, "bulk")
    assert claimer._urgent == {}  # its queue holds a job here: it waits its turn
    claimer.due_at(None, 0, "default")
    assert claimer._urgent == {None: None}  # the plain queues hold nothing: they go first
    holdings.add(job("d1", "default"))
    claimer._urgent.clear()
    claimer.due_at(None, 0, "default")
    assert claimer._urgent == {}
