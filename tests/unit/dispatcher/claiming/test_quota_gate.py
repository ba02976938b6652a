"""The quota gate's shortcuts, without a database: a quota found full is not asked again
before the moment it gave, and a quota holding many attempts is checked for dead holds."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

from brook.common.domain.models import Job
from brook.common.domain.quotas import Holder, Quota, Refused, Start
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
