"""How much work a dispatcher holds ahead of its workers."""

from __future__ import annotations


def test_a_dispatcher_holds_about_a_fifth_of_a_second_of_work_ahead_and_none_of_long_tasks() -> None:
    from dispatcher.held_jobs import Holdings

    holdings = Holdings()
    assert holdings.ahead(2, 32) == 0  # no task has ended yet: it does not know its tasks
    for _ in range(20):
        holdings.record_run(0.001)
    assert holdings.ahead(2, 32) == 32  # 1 ms tasks: capped by the prefetch
    for _ in range(50):
        holdings.record_run(0.05)
    assert holdings.ahead(2, 32) == 8  # 2 workers x 0.2 s / 50 ms
    for _ in range(50):
        holdings.record_run(2.0)
    assert holdings.ahead(2, 32) == 0  # long tasks: nothing held where another could run it


def test_an_aged_job_starts_before_the_jobs_claimed_ahead_by_stored_priority() -> None:
    """Priority aging claims a job for its effective priority: held behind jobs of a higher
    stored priority, a stream of them claimed ahead would starve it in the buffer."""
    from datetime import UTC, datetime, timedelta

    from common.domain.models import Job
    from dispatcher.held_jobs import Holdings

    def job(job_id: str, priority: int, age_s: float) -> Job:
        due = datetime.now(UTC) - timedelta(seconds=age_s)
        return Job.from_doc(
            {"_id": job_id, "task": "noop", "status": "running", "priority": priority,
             "run_at": due, "created_at": due, "attempts": 1}
        )

    holdings = Holdings()
    holdings.add(job("stream-1", 10, 1.0))
    holdings.add(job("stream-2", 10, 0.5))
    holdings.aged("old")
    holdings.add(job("old", 0, 5.0))
    holdings.add(job("stream-3", 10, 0.1))
    started = []
    while (nxt := holdings.next_waiting(None)) is not None:
        holdings.start(nxt.id)
        started.append(nxt.id)
    assert started == ["old", "stream-1", "stream-2", "stream-3"]


def test_a_key_is_held_while_a_job_of_it_waits_or_runs_in_its_queue() -> None:
    """What makes a keyed queue's new key urgent (`Claimer._new_key`): nothing of it here."""
    from datetime import UTC, datetime

    from common.domain.models import Job
    from dispatcher.held_jobs import Holdings

    now = datetime.now(UTC)
    job = Job.from_doc(
        {"_id": "a1", "task": "noop", "status": "running", "queue": "shared", "key": "a",
         "run_at": now, "created_at": now, "attempts": 1}
    )
    holdings = Holdings()
    assert not holdings.holds_key("shared", "a")
    holdings.add(job)
    assert holdings.holds_key("shared", "a")  # waiting
    assert not holdings.holds_key("shared", "b") and not holdings.holds_key("other", "a")
    holdings.start("a1")
    assert holdings.holds_key("shared", "a")  # running
    holdings.worker_done("a1")
    assert not holdings.holds_key("shared", "a")
