"""How much work a dispatcher holds ahead of its workers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from brook.common.domain.models import Job


def held_job(
    job_id: str, age_s: float, queue: str, key: str | None = None, priority: int = 0
) -> Job:
    """A claimed job, due `age_s` ago."""
    due = datetime.now(UTC) - timedelta(seconds=age_s)
    return Job.from_doc(
        {
            "_id": job_id,
            "task": "noop",
            "status": "running",
            "priority": priority,
            "queue": queue,
            "key": key,
            "run_at": due,
            "created_at": due,
            "attempts": 1,
        }
    )


def test_a_dispatcher_holds_about_a_fifth_of_a_second_of_work_ahead_and_none_of_long_tasks() -> None:
    from brook.dispatcher.claiming.holdings import Holdings

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

    from brook.common.domain.models import Job
    from brook.dispatcher.claiming.holdings import Holdings

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
    while (nxt := holdings.next_claimed_ahead(None)) is not None:
        holdings.start(nxt.id)
        started.append(nxt.id)
    assert started == ["old", "stream-1", "stream-2", "stream-3"]


def test_a_key_is_held_while_a_job_of_it_waits_or_runs_in_its_queue() -> None:
    """What makes a keyed queue's new key urgent (`Claimer._new_key`): nothing of it here."""
    from datetime import UTC, datetime

    from brook.common.domain.models import Job
    from brook.dispatcher.claiming.holdings import Holdings

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


def test_in_a_keyed_queue_the_job_whose_key_runs_least_here_starts_first() -> None:
    """Claimed ahead, tenant A's backlog fills the buffer; tenant B's one job, claimed after
    them, starts on the next free worker. Priority still goes first; a plain queue keeps
    claim order."""

    from brook.dispatcher.claiming.holdings import Holdings

    def job(job_id: str, key: str, age_s: float, queue: str = "fair", priority: int = 0) -> Job:
        return held_job(job_id, age_s, queue, key, priority)

    def keyed(queue: str) -> bool:
        return queue == "fair"

    holdings = Holdings()
    for i in range(6):
        holdings.add(job(f"a{i}", "a", 10.0 - i))
    holdings.start("a0")
    holdings.start("a1")
    holdings.add(job("b0", "b", 0.0))  # the newest of all
    nxt = holdings.next_claimed_ahead(None, keyed=keyed)
    assert nxt is not None and nxt.id == "b0"
    holdings.start("b0")
    # Both keys busy: A has two running, B one; B's next job goes first again.
    holdings.add(job("b1", "b", 0.0))
    nxt = holdings.next_claimed_ahead(None, keyed=keyed)
    assert nxt is not None and nxt.id == "b1"
    # A job of a higher priority goes before a quieter key.
    holdings.add(job("a-urgent", "a", 0.0, priority=5))
    nxt = holdings.next_claimed_ahead(None, keyed=keyed)
    assert nxt is not None and nxt.id == "a-urgent"
    # Without keyed turns, claim order (due time) alone.
    plain = Holdings()
    for i in range(3):
        plain.add(job(f"p{i}", "a", 10.0 - i, queue="plain"))
    plain.start("p0")
    plain.add(job("q0", "b", 0.0, queue="plain"))
    nxt = plain.next_claimed_ahead(None, keyed=keyed)
    assert nxt is not None and nxt.id == "p1"


def test_a_job_outranks_the_jobs_waiting_or_with_none_waiting_the_job_claimed_last() -> None:
    """The buffer of a dispatcher draining a backlog is often empty while its refill is in
    flight: a job that outranks what was claimed last jumps that claim too."""
    from datetime import UTC, datetime

    from brook.common.domain.models import Job
    from brook.dispatcher.claiming.holdings import Holdings

    def job(job_id: str, priority: int) -> Job:
        now = datetime.now(UTC)
        return Job.from_doc(
            {"_id": job_id, "task": "noop", "status": "running", "priority": priority,
             "run_at": now, "created_at": now, "attempts": 1}
        )

    holdings = Holdings()
    assert not holdings.outranks(10)  # nothing claimed yet: nothing to jump over
    holdings.add(job("backlog-1", -10))
    holdings.add(job("backlog-2", 0))
    assert holdings.outranks(5) and not holdings.outranks(-10)  # -10 waits here
    holdings.start("backlog-1")
    holdings.start("backlog-2")
    assert holdings.outranks(5) and not holdings.outranks(0)  # none waits: 0 claimed last


def test_the_job_whose_line_runs_least_here_starts_first() -> None:
    """The plain queues' backlog fills the buffer with jobs older than a later job of a
    queue with limits (its own line): that one starts on the next free worker, not after
    the older jobs the buffer keeps refilling with. Jobs of one line keep claim order."""
    from brook.dispatcher.claiming.holdings import Holdings

    def job(job_id: str, queue: str, age_s: float, priority: int = 0) -> Job:
        return held_job(job_id, age_s, queue, priority=priority)

    def line(queue: str) -> str | None:
        return queue if queue == "emails" else None  # a queue with limits; the rest together

    holdings = Holdings()
    for i in range(6):
        holdings.add(job(f"d{i}", "default" if i % 2 else "bulk", 10.0 - i))
    holdings.start("d0")
    holdings.start("d1")
    holdings.add(job("e0", "emails", 0.0))  # the newest of all
    nxt = holdings.next_claimed_ahead(None, line=line)
    assert nxt is not None and nxt.id == "e0"
    holdings.start("e0")
    # emails runs one, the plain line two: emails' next job goes first again
    holdings.add(job("e1", "emails", 0.0))
    nxt = holdings.next_claimed_ahead(None, line=line)
    assert nxt is not None and nxt.id == "e1"
    holdings.start("d2")
    holdings.start("e1")  # now emails runs two, the plain line three
    holdings.add(job("e2", "emails", 0.0))
    nxt = holdings.next_claimed_ahead(None, line=line)
    assert nxt is not None and nxt.id == "e2"
    # A higher priority goes before a quieter line; without lines, claim order alone.
    holdings.add(job("d-urgent", "default", 0.0, priority=5))
    nxt = holdings.next_claimed_ahead(None, line=line)
    assert nxt is not None and nxt.id == "d-urgent"
    nxt = holdings.next_claimed_ahead(None)
    assert nxt is not None and nxt.id == "d-urgent"
    holdings.withdraw("d-urgent")
    nxt = holdings.next_claimed_ahead(None)
    assert nxt is not None and nxt.id == "d3"
