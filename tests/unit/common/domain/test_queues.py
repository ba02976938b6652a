"""Queue limits without a database: validation, the slot arithmetic on a queue document."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brook.common.domain.errors import InvalidInput
from brook.common.domain.queues import QueueDoc, QueueSlot, slot_usage, validate_queue_update

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def queue(now: float = 10.0, **fields: Any) -> QueueDoc:
    return QueueDoc.from_doc({"_id": "q", "now": at(now), **fields})


def test_a_queue_update_keeps_what_it_does_not_name() -> None:
    assert validate_queue_update("q", {}) == {}
    assert validate_queue_update("q", {"concurrency": 3}) == {"concurrency": 3}
    assert validate_queue_update("q", {"concurrency": None, "paused": True}) == {
        "concurrency": None,
        "paused": True,
    }
    assert validate_queue_update("q", {"rate": {"limit": 20, "per_seconds": 2}}) == {
        "rate": {"limit": 20, "per_seconds": 2.0}
    }


@pytest.mark.parametrize(
    "body",
    [
        {"concurrency": 0},
        {"concurrency": True},
        {"rate": {"limit": 1, "per_seconds": float("inf")}},
        {"rate": {"limit": 1, "per_seconds": float("nan")}},
        {"rate": {"limit": 10_001, "per_seconds": 1}},
        {"paused": None},
        {"unknown": 1},
        "not an object",
    ],
)
def test_a_bad_queue_update_is_refused(body: Any) -> None:
    with pytest.raises(InvalidInput):
        validate_queue_update("q", body)


def test_a_bad_queue_name_is_refused() -> None:
    with pytest.raises(InvalidInput, match="not a queue name"):
        validate_queue_update("has space", {"paused": True})


def test_why_a_queue_gives_no_slot() -> None:
    now = at(10)
    assert queue().blocked(now) == ("unlimited", None)
    assert queue(paused=True, concurrency=1).blocked(now) == ("paused", None)
    slots = [
        {"job": "j1", "tag": "t"},
        {"job": "a", "tag": "k", "claim_by": at(12)},
        {"job": "b", "tag": "k", "claim_by": at(12)},
    ]
    assert queue(concurrency=3, slots=slots).blocked(now) == ("full", None)
    assert queue(concurrency=4, slots=slots).blocked(now) == ("room", now)
    assert queue(concurrency=4, used=4).blocked(now) == ("full", None)  # as `take` counts


def test_the_rate_window_counts_starts_and_claims_in_flight_and_says_when_it_frees() -> None:
    rate = {"limit": 3, "per_seconds": 2.0}
    # The window counted is 2 s + RATE_START_MARGIN_S (0.25 s): claims are counted, and a
    # claimed job starts within that margin of its claim.
    starts = [at(7.7), at(8.5), at(9.0)]  # 7.7 has left the window ending at 10
    in_flight = [{"job": "a", "tag": "k", "claim_by": at(11)}, {"job": "b", "tag": "s"}]
    doc = queue(rate=rate, starts=starts, slots=in_flight)
    assert doc.window_starts(at(10)) == [at(8.5), at(9.0), at(11)]
    # Full: the next start may come when the oldest counted one leaves, at 8.5 + 2.25.
    assert doc.blocked(at(10)) == ("rate", at(10.75))
    assert queue(rate=rate, starts=starts).blocked(at(10)) == ("room", at(10))


def test_a_slot_is_in_use_while_its_claim_may_land_or_its_job_runs_under_it() -> None:
    tagged = QueueSlot(job="j", tag="t")
    adopted = QueueSlot(job="j", tag="x", attempt=2, adopted=True)
    in_flight = QueueSlot(job="j", tag="t", claim_by=at(12))
    running = {"status": "running", "attempts": 2, "claim_tag": "t"}
    assert tagged.held_by(running) and adopted.held_by(running)
    assert not tagged.held_by({**running, "claim_tag": "other"})  # a later claim's
    assert adopted.held_by({**running, "claim_tag": "other"})
    assert not adopted.held_by({**running, "attempts": 3})
    assert not tagged.held_by({**running, "status": "pending"})
    assert not tagged.held_by(None)
    assert in_flight.in_use(None, at(10)) and not in_flight.in_use(None, at(12))
    assert in_flight.in_use(running, at(13))


def test_slot_usage_counts_the_slots_in_use_and_names_the_rest() -> None:
    doc = queue(
        concurrency=10,
        slots=[
            {"job": "a", "tag": "t1"},
            {"job": "b", "tag": "t1"},
            {"job": "c", "tag": "t2", "claim_by": at(11)},  # may still land
            {"job": "e", "tag": "t3", "claim_by": at(9)},  # landed: e runs under it
            {"job": "f", "tag": "t3", "claim_by": at(9)},  # never landed
        ],
    )
    jobs = {
        "a": {"_id": "a", "status": "running", "attempts": 1, "claim_tag": "t1"},
        "b": {"_id": "b", "status": "completed", "attempts": 1, "claim_tag": "t1"},
        "e": {"_id": "e", "status": "running", "attempts": 1, "claim_tag": "t3"},
        "f": {"_id": "f", "status": "pending", "attempts": 0},
    }
    in_use, dead = slot_usage(doc, jobs, at(10))
    assert in_use == 3 and [s.job for s in dead] == ["b", "f"]
