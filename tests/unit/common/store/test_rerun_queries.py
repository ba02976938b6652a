"""A rerun's document, built without a database: what it takes of the job it reruns and
what it leaves."""

from __future__ import annotations

from datetime import UTC, datetime

from brook.common.store import queries

AT = datetime(2026, 1, 1, tzinfo=UTC)
SOURCE = {
    "_id": "src",
    "task": "pipeline",
    "payload": {"doc": 7},
    "status": "failed",
    "queue": "llm",
    "priority": 3,
    "key": "acme",
    "max_attempts": 7,  # grown by sleeps and a retry
    "attempt_budget": 2,  # as submitted
    "timeout_s": 90.0,
    "retention_s": 3600.0,
    "idempotency_key": "doc-7",
    "unique_until": AT,
    "schedule": {"name": "nightly", "tick": AT},
    "trigger": {"name": "t", "change_id": "c", "operation": "insert"},
    "spawned_by": "parent-job",
    "depends_on": ["p1", "p2"],
    "parents_left": [],
    "run_on_parent_failure": True,
    "result": None,
    "error": {"type": "RuntimeError", "message": "boom", "step": "c"},
    "output": {"chunks": 9, "bytes": 90},
    "reruns": ["earlier"],
}
STEPS = [
    {"name": "a", "result": 1, "at": AT, "duration_ms": 1.0, "size": 10, "attempt": 1},
    {"name": "b", "result": 2, "at": AT, "duration_ms": 1.0, "size": 12, "attempt": 2},
]


def test_a_rerun_takes_the_jobs_task_queue_key_and_limits_but_never_its_key_or_origin() -> None:
    doc = queries.rerun_job(SOURCE, "new", "c", STEPS, None, AT)
    assert doc["_id"] == "new" and doc["status"] == "pending" and doc["run_at"] == AT
    taken = ("task", "payload", "queue", "priority", "key", "timeout_s", "retention_s")
    assert {f: doc[f] for f in taken} == {f: SOURCE[f] for f in taken}
    assert doc["max_attempts"] == doc["attempt_budget"] == 2 and doc["attempts"] == 0
    for left in ("idempotency_key", "unique_until", "schedule", "trigger", "spawned_by"):
        assert left not in doc, left
    assert (doc["result"], doc["error"], "output" in doc, "reruns" in doc) == (
        None,
        None,
        False,
        False,
    )
    assert doc["depends_on"] == ["p1", "p2"] and doc["run_on_parent_failure"] is True
    assert "parents_left" not in doc  # its parents all ended: it is pending, not waiting
    assert doc["rerun_of"] == "src"
    assert doc["history"] == [
        {"status": "pending", "at": AT, "attempt": 0, "rerun_of": "src", "from_step": "c"}
    ]
    assert [(s["name"], s["attempt"], s["carried_from"]) for s in doc["steps"]] == [
        ("a", 0, "src"),
        ("b", 0, "src"),
    ]
    assert doc["steps_bytes"] == 22


def test_a_rerun_with_a_payload_takes_it_and_from_the_first_step_carries_nothing() -> None:
    doc = queries.rerun_job(SOURCE, "new", "a", [], {"doc": 8}, AT)
    assert doc["payload"] == {"doc": 8} and "steps" not in doc and "steps_bytes" not in doc
    assert SOURCE["payload"] == {"doc": 7}  # the job's own is untouched
