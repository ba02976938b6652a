"""`brook watch`'s lines: each event of a job's story reads differently, stamped with its own time.

The events are the job as the API's stream carries it after each change (the shapes seen
from a `sleep` job that was cancelled while it ran).
"""

from __future__ import annotations

from typing import Any

from brook.watching import event_line

CREATED = "2026-12-01T01:36:31.509000+00:00"
CLAIMED = "2026-12-01T01:36:31.516000+00:00"
STARTED = "2026-12-01T01:36:31.521000+00:00"
REPORTED = "2026-12-01T01:36:32.100000+00:00"
ENDED = "2026-12-01T01:36:33.504000+00:00"
ENDED_WRITTEN = "2026-12-01T01:36:33.506000+00:00"


def job(status: str, history: list[tuple[str, str]], **fields: Any) -> dict[str, Any]:
    return {
        "id": "6b0e249fd41c92c38c95ee2f",
        "task": "sleep",
        "status": status,
        "attempts": 0 if status == "pending" else 1,
        "max_attempts": 3,
        "created_at": CREATED,
        "started_at": None,
        "finished_at": None,
        "cancel_requested": False,
        "progress": None,
        "error": None,
        "history": [{"status": s, "at": at, "attempt": 1} for s, at in history],
        **fields,
    }


SUBMITTED = [("pending", CREATED)]
RUNNING = [*SUBMITTED, ("running", CLAIMED)]


def test_a_claim_is_stamped_with_its_own_time_not_the_submit() -> None:
    line = event_line(job("running", RUNNING))
    assert line.startswith(CLAIMED[:23]) and line.endswith("attempt 1/3  claimed")


def test_the_story_of_a_job_cancelled_while_it_ran_reads_as_five_different_lines() -> None:
    events = [
        job("pending", SUBMITTED),
        job("running", RUNNING),
        job("running", RUNNING, started_at=STARTED),
        job("running", RUNNING, started_at=STARTED, cancel_requested=True),
        job(
            "cancelled",
            [*RUNNING, ("cancelled", ENDED_WRITTEN)],
            started_at=STARTED,
            finished_at=ENDED,
            cancel_requested=True,
            error={"type": "Cancelled", "message": "cancelled while running"},
        ),
    ]
    lines = [event_line(e) for e in events]
    assert len(set(lines)) == 5
    # The job records no time for a cancel request: its latest time is still the start.
    stamps = [CREATED, CLAIMED, STARTED, STARTED, ENDED_WRITTEN]
    assert [line[:23] for line in lines] == [at[:23] for at in stamps]
    assert lines[2].endswith("  started")
    assert lines[3].endswith("  started  cancel requested")
    assert lines[4].endswith("  Cancelled: cancelled while running")


def test_progress_shows_its_fraction_and_message_at_its_own_time() -> None:
    progress = {"fraction": 0.25, "message": "1/4 rows", "at": REPORTED, "attempt": 1}
    line = event_line(job("running", RUNNING, started_at=STARTED, progress=progress))
    assert line.startswith(REPORTED[:23]) and line.endswith("  25% 1/4 rows")


def test_an_earlier_attempts_progress_is_not_shown_as_this_ones() -> None:
    old = {"fraction": 0.9, "message": None, "at": REPORTED, "attempt": 1}
    retried = job("running", [*RUNNING, ("pending", ENDED), ("running", ENDED_WRITTEN)])
    retried.update(attempts=2, started_at=None, progress=old)
    assert event_line(retried).endswith("attempt 2/3  claimed")
    retried["started_at"] = "2026-12-01T01:36:33.600000+00:00"
    assert event_line(retried).endswith("attempt 2/3  started")


def test_a_job_back_to_pending_says_which_error_ended_its_last_attempt() -> None:
    error = {"type": "DemoFailure", "message": "failed on purpose", "traceback": "..."}
    requeued = job("pending", [*RUNNING, ("pending", ENDED)], attempts=1, error=error)
    line = event_line(requeued)
    assert line.startswith(ENDED[:23])
    assert line.endswith("attempt 1/3  retry after DemoFailure: failed on purpose")
    assert event_line(job("pending", SUBMITTED)).endswith("attempt 0/3")
