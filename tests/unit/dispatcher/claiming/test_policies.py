"""The claim policy of each target, chosen from its limits, and the admission check beside
it, without a database."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from brook.common.domain.queues import QueueDoc, QueueLimits
from brook.common.runtime.settings import Settings
from brook.dispatcher.claiming.claimer import Claimer
from brook.dispatcher.claiming.holdings import Holdings
from brook.dispatcher.claiming.limits import Limits
from brook.dispatcher.claiming.policies import (
    AdmitAll,
    AgedClaim,
    FairClaim,
    KeySlotsClaim,
    PlainClaim,
    QueueSlotsClaim,
)
from tests.unit.dispatcher.claiming.test_claimer import FakeStore, job, wired


def limits_with(settings: Settings, view: dict[str, QueueLimits]) -> Limits:
    limits = Limits(wired(settings, FakeStore({}), Holdings()), cast(Any, None))
    limits._apply(
        {q: cast(QueueDoc, SimpleNamespace(limits=v)) for q, v in view.items()}, complete=True
    )
    return limits


def test_each_target_takes_the_policy_its_limits_choose() -> None:
    limits = limits_with(
        Settings(),
        {
            "capped": QueueLimits(concurrency=2),
            "keyed": QueueLimits(key_concurrency=1, concurrency=5),
            "per_key": QueueLimits(key_concurrency=2),
            "fair": QueueLimits(fair=True),
        },
    )
    assert isinstance(limits.policy(None), PlainClaim)  # every queue without limits
    assert isinstance(limits.policy("default"), PlainClaim)
    assert isinstance(limits.policy("capped"), QueueSlotsClaim)
    assert isinstance(limits.policy("keyed"), QueueSlotsClaim)
    assert isinstance(limits.policy("per_key"), KeySlotsClaim)
    assert isinstance(limits.policy("fair"), FairClaim)
    assert limits.policy("capped") is limits.policy("capped")  # chosen once


def test_priority_aging_makes_the_plain_claim_an_aged_one() -> None:
    limits = limits_with(Settings(priority_aging_seconds=5), {"capped": QueueLimits(concurrency=1)})
    assert isinstance(limits.policy(None), AgedClaim)
    assert isinstance(limits.policy("capped"), QueueSlotsClaim)  # limited queues never age


def test_a_change_of_limits_chooses_the_policy_again() -> None:
    limits = limits_with(Settings(), {"q": QueueLimits(fair=True)})
    assert isinstance(limits.policy("q"), FairClaim)
    doc = cast(QueueDoc, SimpleNamespace(limits=QueueLimits(concurrency=3)))
    limits._apply({"q": doc}, complete=False)
    assert isinstance(limits.policy("q"), QueueSlotsClaim)
    limits._apply({"q": None}, complete=False)
    assert isinstance(limits.policy("q"), PlainClaim)


def test_every_job_a_policy_wins_passes_the_admission_check_before_it_may_start() -> None:
    settings = Settings()
    wiring = wired(settings, FakeStore({}), Holdings())
    limits = Limits(wiring, cast(Any, None))
    started: list[str] = []
    refused: list[str] = []

    class OnlyEven:
        def admits(self, claimed: Any) -> bool:
            return int(claimed.id) % 2 == 0

    Claimer(
        wiring,
        lambda j, sent: started.append(j.id),
        limits,
        admission=OnlyEven(),
        refuse=lambda j, sent: refused.append(j.id),
    )
    for i in range(4):
        limits.take(job(str(i), "default"), 0.0)  # as a policy hands each job it won
    assert started == ["0", "2"] and refused == ["1", "3"]
    assert AdmitAll().admits(job("1", "default"))
