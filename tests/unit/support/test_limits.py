"""The measurements the queue-limit end-to-end tests rely on (`tests.support.limits`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bson import Timestamp

from brook.common.domain.models import Doc
from tests.support.limits import (
    Attempt,
    attempts,
    max_overlap,
    max_overlap_committed,
    max_starts_in_window,
    running_in_commit_order,
    status_change,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_attempts_and_overlap_come_from_the_history() -> None:
    docs = [
        {
            "_id": "a",
            "history": [
                {"status": "pending", "at": at(0), "attempt": 0},
                {"status": "running", "at": at(1), "attempt": 1},
                {"status": "pending", "at": at(3), "attempt": 1},  # a lease expiry
                {"status": "running", "at": at(4), "attempt": 2},
                {"status": "completed", "at": at(5), "attempt": 2},
            ],
        },
        {
            "_id": "b",
            "history": [
                {"status": "pending", "at": at(0), "attempt": 0},
                {"status": "running", "at": at(3), "attempt": 1},  # starts as a's first ends
            ],
        },
    ]
    spans = attempts(docs)
    assert spans == [
        Attempt("a", 1, at(1), at(3)),
        Attempt("a", 2, at(4), at(5)),
        Attempt("b", 1, at(3), None),
    ]
    assert max_overlap(spans) == 2  # b (still running) with a's second attempt
    assert max_overlap(spans[:1] + spans[2:]) == 1  # half-open: 3 is not shared


def test_starts_in_a_window_are_counted_half_open() -> None:
    starts = [at(0), at(0.5), at(1.0), at(2.0), at(2.1)]
    assert max_starts_in_window(starts, 2.0) == 4  # [0.5, 2.5); [0, 2) holds only 3
    assert max_starts_in_window(starts[:4], 2.0) == 3  # 2.0 is not in [0, 2)
    assert max_starts_in_window(starts, 2.2) == 5
    assert max_starts_in_window([], 1.0) == 0


def test_runs_in_commit_order_come_from_the_change_streams_status_changes() -> None:
    def event(job_id: str, status: str | None, ts: Timestamp, op: str = "update") -> Doc:
        fields = {"status": status} if status else {"lease_expires_at": at(9)}
        return {
            "operationType": op,
            "documentKey": {"_id": job_id},
            "clusterTime": ts,
            "updateDescription": {"updatedFields": fields},
        }

    events = [
        event("a", "running", Timestamp(10, 1)),
        event("a", None, Timestamp(10, 2)),  # a renewal: not a change of status
        event("b", "running", Timestamp(10, 3)),
        event("a", "completed", Timestamp(11, 1)),
        event("c", "running", Timestamp(11, 2)),  # takes a's place: after its end commits
        event("b", "pending", Timestamp(12, 1)),
    ]
    changes = [c for e in events if (c := status_change(e)) is not None]
    assert [c.status for c in changes] == ["running", "running", "completed", "running", "pending"]
    spans = running_in_commit_order(reversed(changes))  # sorted per job by their order
    assert sorted(spans) == [
        ("a", (10, 1), (11, 1)),
        ("b", (10, 3), (12, 1)),
        ("c", (11, 2), None),
    ]
    assert max_overlap_committed(spans) == 2
    assert max_overlap_committed([*spans, ("d", (11, 1), None)]) == 3  # at a's very end: after it
