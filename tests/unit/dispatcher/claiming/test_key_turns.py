"""Keys without a database: a job's `key` as the validator takes it, the per-key limits of a
queue update, the turns of fair claiming, and which keys a queue document shows full."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from brook.common.domain.errors import InvalidInput
from brook.common.domain.queues import QueueDoc, QueueLimits, validate_queue_update
from brook.common.domain.validation import validate_batch, validate_spec
from brook.dispatcher.claiming.key_turns import KeyTurns, interleave


def test_a_job_key_is_a_non_empty_string_of_at_most_256_characters() -> None:
    assert validate_spec({"task": "noop", "key": "acme"}).key == "acme"
    assert validate_spec({"task": "noop"}).key is None
    for bad in ("", "x" * 257, 5, ["a"]):
        with pytest.raises(InvalidInput):
            validate_spec({"task": "noop", "key": bad})
    with pytest.raises(InvalidInput) as exc:
        validate_batch({"jobs": [{"task": "noop"}, {"task": "noop", "key": 3}]})
    assert exc.value.detail[0]["loc"][:2] == ["jobs", 1]  # type: ignore[index]


def test_key_limits_are_validated_like_the_queues_own() -> None:
    changes = validate_queue_update(
        "tenants", {"key_concurrency": 2, "key_rate": {"limit": 5, "per_seconds": 1}}
    )
    assert changes == {"key_concurrency": 2, "key_rate": {"limit": 5, "per_seconds": 1.0}}
    assert validate_queue_update("tenants", {"fair": True}) == {"fair": True}
    assert validate_queue_update("tenants", {"key_concurrency": None}) == {
        "key_concurrency": None
    }
    for bad in (
        {"key_concurrency": 0},
        {"key_concurrency": "2"},
        {"key_rate": {"limit": 0, "per_seconds": 1}},
        {"fair": None},
        {"fair": "yes"},
    ):
        with pytest.raises(InvalidInput):
            validate_queue_update("tenants", bad)


def test_a_key_limit_makes_a_queue_limited_and_claimed_by_turns() -> None:
    assert not QueueLimits().keyed
    limits = QueueLimits.from_doc({"key_concurrency": 2})
    assert limits.limited and limits.keyed and not limits.rated
    rated = QueueLimits.from_doc({"key_rate": {"limit": 1, "per_seconds": 2}})
    assert rated.keyed and rated.rated
    assert QueueLimits.from_doc({"fair": True}).limited


def test_turns_put_new_keys_first_and_served_keys_last() -> None:
    turns = KeyTurns()
    turns.refreshed(["a", "b", "c"])
    assert turns.pick(10, 0.0, 0) == ["a", "b", "c"]
    turns.served(["a", "b"])
    assert turns.keys() == ["c", "a", "b"]
    turns.saw("new")  # a key never served comes first
    turns.saw("a")  # a known key keeps its turn
    assert turns.keys() == ["new", "c", "a", "b"]
    turns.dry(["c"])
    assert turns.pick(2, 0.0, 0) == ["new", "a"]


def test_a_waiting_key_is_skipped_until_a_release_or_its_time() -> None:
    turns = KeyTurns()
    turns.refreshed(["a", "b", None])
    turns.wait({"a": None, "b": 10.0}, generation=1)
    assert turns.pick(5, 5.0, 1) == [None]
    turns.dry([None])
    assert turns.waiting(5.0, 1) and turns.next_free() == 10.0
    assert turns.pick(5, 5.0, 2) == ["a"]  # a slot was released: a may try again
    assert turns.pick(5, 10.0, 2) == ["a", "b"]  # b's window moved


def test_a_refresh_keeps_known_turns_and_keys_seen_while_it_ran() -> None:
    turns = KeyTurns()
    turns.refreshed(["a", "b"])
    turns.served(["a"])
    turns.refresh_started()
    turns.saw("late")
    turns.refreshed(["a", "b", "c"])
    assert turns.keys() == ["c", "late", "b", "a"] and not turns.stale


def test_interleaving_takes_one_job_of_each_key_in_turn_then_priority_first() -> None:
    found = {
        "a": [{"_id": "a1", "priority": 0}, {"_id": "a2", "priority": 0}],
        "b": [{"_id": "b1", "priority": 0}],
        None: [{"_id": "n1", "priority": 5}],
    }
    assert [d["_id"] for d in interleave(found)] == ["n1", "a1", "b1", "a2"]


def test_a_queue_document_names_the_keys_at_their_limits() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    doc = QueueDoc.from_doc(
        {
            "_id": "tenants",
            "key_concurrency": 2,
            "key_rate": {"limit": 2, "per_seconds": 10},
            "slots": [
                {"job": "1", "tag": "t", "key": "a"},
                {"job": "2", "tag": "t", "key": "a"},
                {"job": "3", "tag": "t", "key": "b", "claim_by": now + timedelta(seconds=1)},
            ],
            "key_starts": [{"key": "b", "at": now - timedelta(seconds=4)}],
        }
    )
    waits = doc.key_waits(["a", "b", "c", None], now)
    assert waits["a"] is None
    # b: a start 4 s ago and a claim in flight (counted at its claim_by): out of starts
    # until the older one leaves the window (10 s and the start margin).
    assert waits["b"] == now - timedelta(seconds=4) + timedelta(seconds=10.25)
    assert "c" not in waits


def test_a_debounced_spec_needs_its_key_and_quiet_time_and_takes_no_schedule_of_its_own() -> None:
    spec = validate_spec(
        {"task": "noop", "debounce_key": "doc-7", "debounce_s": 2, "debounce_max_s": 5}
    )
    assert (spec.debounce_key, spec.debounce_s, spec.debounce_max_s) == ("doc-7", 2, 5)
    for bad in (
        {"debounce_key": "doc-7"},
        {"debounce_s": 2},
        {"debounce_max_s": 3},
        {"debounce_key": "doc-7", "debounce_s": 2, "debounce_max_s": 1},
        {"debounce_key": "doc-7", "debounce_s": 0},
        {"debounce_key": "doc-7", "debounce_s": 2, "idempotency_key": "k"},
        {"debounce_key": "doc-7", "debounce_s": 2, "delay": 1},
        {"debounce_key": "", "debounce_s": 2},
    ):
        with pytest.raises(InvalidInput):
            validate_spec({"task": "noop", **bad})


def test_a_debounce_join_keeps_the_first_submits_fields_and_takes_the_latest_payload() -> None:
    from brook.common.domain.models import JobSpec
    from brook.common.store import queries

    spec = JobSpec(task="noop", payload={"v": 2}, debounce_key="doc-7", debounce_s=2)
    write = queries.debounced("j9", spec)
    # Only a job not yet claimed is joined (one back to pending for a retry is not).
    assert write.filter == {"debounce_key": "doc-7", "status": "pending", "debounce_open": True}
    assert isinstance(write.update, list)
    first, latest = write.update
    # A new job's fields only when there is none yet (its `_id` the fresh one).
    assert first["$set"]["_id"] == {"$ifNull": ["$_id", {"$literal": "j9"}]}
    assert first["$set"]["created_at"]["$cond"][2] == "$created_at"
    assert latest["$set"]["payload"] == {"$literal": {"v": 2}}
    # Due once quiet for 2 s, never after the first submit's longest wait.
    assert latest["$set"]["run_at"] == {"$min": [{"$add": ["$$NOW", 2000]}, "$debounce_until"]}


def test_effective_priority_rises_by_one_per_interval_waited() -> None:
    from brook.dispatcher.claiming.aging import effective

    now = datetime(2026, 1, 1, tzinfo=UTC)
    doc = {"priority": 3, "run_at": now - timedelta(seconds=2.6)}
    assert effective(doc, now, 0.5) == 3 + 5
    assert effective({"priority": 0, "run_at": now + timedelta(seconds=9)}, now, 1.0) == 0


def test_priority_aging_is_a_setting_off_by_default() -> None:
    from brook.common.runtime.settings import Settings

    assert Settings().priority_aging_seconds is None
    assert Settings(priority_aging_seconds=30).priority_aging_seconds == 30
    with pytest.raises(ValueError):
        Settings(priority_aging_seconds=0)


def test_a_key_heard_of_during_a_look_is_not_dropped_by_that_looks_empty_read() -> None:
    # The look read before the job was there (a job heard of from the oplog before it is
    # majority-committed): dropping its key would leave the job to the next sweep.
    turns = KeyTurns()
    turns.refreshed(["b"])
    turns.look_started()
    turns.saw("b")  # a new job of b, while the look reads
    turns.dry(["b"])
    assert turns.keys() == ["b"]
    turns.look_started()
    turns.dry(["b"])  # the next look finds it empty too: now it goes
    assert turns.keys() == []


def test_any_other_key_that_may_start_looks_past_the_keys_just_read_and_the_waiting() -> None:
    turns = KeyTurns()
    turns.refreshed(["a", "b", "c"])
    assert turns.any_other({"a", "b"}, now=0, generation=0)
    turns.wait({"c": None}, 0)  # at its limit until a slot is released (the generation moves)
    assert not turns.any_other({"a", "b"}, now=0, generation=0)
    assert turns.any_other({"a", "b"}, now=0, generation=1)
    turns.wait({"c": 5.0}, 1)  # out of starts until t=5
    assert not turns.any_other({"a", "b"}, now=4, generation=1)
    assert turns.any_other({"a", "b"}, now=5, generation=1)
    turns.saw(None)  # the jobs without a key never wait
    turns.wait({"c": 9.0}, 1)
    assert turns.any_other({"a", "b"}, now=6, generation=1)
