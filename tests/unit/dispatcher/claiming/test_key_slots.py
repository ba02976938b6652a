"""Per-key slots held on the jobs (`dispatcher.claiming.key_slots`), without a database: which
index each candidate asks for, and which queues' running jobs take a slot another way
when their limits change."""

from __future__ import annotations

from typing import Any, cast

from brook.common.domain.queues import QueueLimits, key_slot
from brook.dispatcher.claiming.key_slots import KeySlots, SlotsHeld, moved


def slots() -> KeySlots:
    held: dict[tuple[str, int], SlotsHeld] = {}
    none = cast(Any, None)
    return KeySlots(none, "d1", 30, none, none, none, held, none)


def doc(job_id: str, key: str | None) -> dict[str, Any]:
    return {"_id": job_id, "key": key}


def test_each_candidate_asks_for_an_index_its_key_does_not_hold_here() -> None:
    s = slots()
    asked, full = s.ask("q", 2, [doc("1", "a"), doc("2", "a"), doc("3", "a"), doc("4", None)], 10)
    assert asked == {"1": ("a", 0), "2": ("a", 1), "4": None} and full == ["a"]
    # Reserved until the claim answers: a claim beside it asks for none of A's.
    again, full = s.ask("q", 2, [doc("5", "a"), doc("6", "b")], 10)
    assert again == {"6": ("b", 0)} and full == ["a"]
    s.free("q", "a", 0)
    third, _ = s.ask("q", 2, [doc("7", "a")], 10)
    assert third == {"7": ("a", 0)}


def test_no_more_than_n_candidates_and_a_lowered_limit_counts_the_higher_indexes() -> None:
    s = slots()
    asked, _ = s.ask("q", 3, [doc(str(i), f"k{i}") for i in range(5)], 2)
    assert list(asked) == ["0", "1"]
    s.ask("q", 3, [doc("x", "a"), doc("y", "a"), doc("z", "a")], 3)  # indexes 0, 1, 2
    s.free("q", "a", 0)
    # Lowered to 1: index 0 is free, but two of A's jobs still run here.
    asked, full = s.ask("q", 1, [doc("w", "a")], 1)
    assert asked == {} and full == ["a"]


def test_a_slot_is_named_by_queue_index_and_key() -> None:
    assert key_slot("tenants", "acme:eu", 1) == "tenants:1:acme:eu"
    assert key_slot("tenants", "acme:eu", 1).split(":", 2)[2] == "acme:eu"


def test_running_jobs_take_a_slot_the_new_way_when_their_queues_limits_move() -> None:
    on_jobs = QueueLimits(key_concurrency=2)
    in_doc = QueueLimits(key_concurrency=2, concurrency=5)
    fair = QueueLimits(fair=True)
    old = {"a": on_jobs, "b": in_doc, "c": on_jobs, "f": fair}
    new = {
        "a": in_doc,
        "b": on_jobs,
        "c": QueueLimits(key_concurrency=3),
        "d": on_jobs,
        "e": in_doc,
        "f": on_jobs,
    }
    to_doc, to_jobs = moved(old, new, ["a", "b", "c", "d", "e", "f", "gone"])
    assert to_doc == {"a", "e"}
    assert to_jobs == {"b", "d", "f"}
