"""The quota gate's shortcuts, without a database: a quota found full is not asked again
before the moment it gave, and a quota holding many attempts is checked for dead holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

from brook.common.domain.models import Job
from brook.common.domain.quotas import Holder, Quota, Refused, Start, Window, admit
from brook.common.store.quotas import QuotaStore
from brook.dispatcher.claiming.quota_gate import PRUNE_AT, QuotaGate
from brook.dispatcher.wiring import Wiring


def job(job_id: str, key: str | None = None) -> Job:
    now = datetime.now(UTC)
    return Job.from_doc(
        {
            "_id": job_id,
            "task": "call",
            "status": "running",
            "queue": "default",
            "run_at": now,
            "created_at": now,
            "attempts": 1,
            "history": [],
            "quotas": {"model": 100},
            "key": key,
        }
    )


class FakeQuotas:
    """Answers each charge with `answer(start)`; counts what the gate asked."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.charges: list[str] = []
        self.pruned = 0
        self.noted: list[str] = []

    async def charge(self, name: str, start: Start) -> Quota | Refused:
        self.charges.append(start.job)
        out: Quota | Refused = self.answer(start)
        return out

    async def prune(self, name: str) -> int:
        self.pruned += 1
        return 0

    async def waiting(self, name: str, key: str) -> None:
        self.noted.append(key)

    async def refund(self, name: str, job: str, attempt: int) -> None:
        pass

    async def wake(self, name: str, n: int, not_key: str | None = None) -> int:
        return 0


def gate(store: FakeQuotas) -> QuotaGate:
    wiring = SimpleNamespace(
        settings=SimpleNamespace(sweep_seconds=1.0), owner="d1", spawn=lambda coro, name: None
    )
    return QuotaGate(cast(Wiring, wiring), cast(QuotaStore, store))


def later() -> float:
    return datetime.now(UTC).timestamp() + 60


async def test_a_quota_found_full_is_not_asked_again_before_the_moment_it_gave() -> None:
    store = FakeQuotas(lambda s: Refused(reason="units", retry_at=later()))
    g = gate(store)
    first = await g._charge_all(job("a"))
    second = await g._charge_all(job("b", key="tenant"))
    assert first is not None and second is not None
    assert first[1].reason == second[1].reason == "units"
    assert store.charges == ["a"]  # the second was refused from the cache
    # Its key still counts among those waiting for room (fair shares), once in a while.
    await g._charge_all(job("c", key="tenant"))
    assert store.noted == ["tenant"]


async def test_a_quota_holding_many_attempts_over_its_concurrency_is_checked_for_dead_holds() -> (
    None
):
    def holding(n: int) -> Quota:
        held = tuple(
            Holder(job=f"h{i}", attempt=1, owner="d", key=None, units=1.0, t=None) for i in range(n)
        )
        return Quota(name="model", concurrency=None, holders=held)

    store = FakeQuotas(lambda s: holding(PRUNE_AT - 1))
    assert await gate(store)._charge_all(job("a")) is None
    assert store.pruned == 0
    store = FakeQuotas(lambda s: holding(PRUNE_AT))
    assert await gate(store)._charge_all(job("b")) is None
    assert store.pruned == 1


async def test_jobs_held_back_together_are_due_at_moments_scattered_over_the_spread() -> None:
    # Twenty jobs refused for one bucket of 3 s come back over those 3 s, not all at its
    # first instant (where a limit the provider had just lowered would meet all of them).
    at = later()
    store = FakeQuotas(lambda s: Refused(reason="units", retry_at=at, spread=3.0))
    held: list[datetime] = []

    async def hold_back(lease: Any, owner: str, name: str, reason: str, until: datetime) -> bool:
        held.append(until)
        return True

    store.hold_back = hold_back  # type: ignore[attr-defined]
    g = gate(store)
    for i in range(20):
        await g._admit(job(f"j{i}"), 0.0)
    offsets = sorted(u.timestamp() - at for u in held)
    assert len(offsets) == 20 and offsets[0] >= 0 and offsets[-1] <= 3.0
    assert offsets[-1] - offsets[0] > 1.0, offsets


def test_a_window_refusal_spreads_its_retry_over_a_bucket() -> None:
    q = Quota(name="model", units=Window(limit=1000, per_seconds=60.0))
    now = datetime.now(UTC)
    full = admit(q, Start(job="a", attempt=1, owner="d1", key=None, cost=1000), now)
    assert isinstance(full, Quota)
    out = admit(full, Start(job="b", attempt=1, owner="d1", key=None, cost=10), now)
    assert isinstance(out, Refused) and out.reason == "units" and out.spread == 3.0
    closed = admit(
        Quota(
            name="m",
            units=Window(limit=1000, per_seconds=60.0),
            closed_until=now + timedelta(seconds=5),
        ),
        Start(job="c", attempt=1, owner="d1", key=None, cost=10),
        now,
    )
    assert isinstance(closed, Refused) and closed.reason == "closed" and closed.spread == 3.0
