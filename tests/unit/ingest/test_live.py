"""Watching Brook live without a database: a token's cluster time, event filters."""

from __future__ import annotations

from typing import cast

from brook.common.store.jobs import JobStore
from brook.ingest.live import EventFilter, Hub, LiveEvent, Position, cluster_seconds

TOKEN = "826B0D3468000000032B022C0100296E5A1004FD"


def event(status: str, wall_s: float) -> LiveEvent:
    return LiveEvent(
        at=Position(token={"_data": TOKEN}, wall_ms=int(wall_s * 1000)),
        job_id="j1",
        task="t",
        queue="default",
        status=status,
        data="{}",
    )


def test_a_tokens_cluster_time_is_read_from_its_keystring() -> None:
    assert cluster_seconds(TOKEN) == 0x6B0D3468
    assert cluster_seconds("FFFF") is None and cluster_seconds("00" * 20) is None


def test_filters_match_on_every_field_given() -> None:
    ev = event("running", 0)
    assert EventFilter().matches(ev) and EventFilter(job_id="j1", status="running").matches(ev)
    assert not EventFilter(queue="other").matches(ev) and not EventFilter(task="x").matches(ev)


def numbered(n: int, text_bytes: int) -> LiveEvent:
    """The n-th event of a stream, its text `text_bytes` long."""
    return LiveEvent(
        at=Position(token={"_data": f"82{n:08X}00000001"}, wall_ms=n),
        job_id=f"j{n}",
        task="t",
        queue="default",
        status="pending",
        data="x" * text_bytes,
    )


def test_the_ring_lets_its_oldest_events_go_once_their_bytes_are_over_its_budget() -> None:
    events = [numbered(n, 1000) for n in range(1, 7)]
    hub = Hub(cast(JobStore, None), buffer=10, ring_size=100, ring_bytes=3 * events[0].size)
    for ev in events:
        hub._publish(ev)
    assert hub.ring_used() == (3, 3 * events[0].size)
    # Resuming from memory: from the last event it let go on (4, 5, 6 follow) ...
    assert hub.replays(events[2].at) and not hub.replays(events[1].at)
    sub = hub.subscribe(EventFilter(), since=events[2].at)
    assert sub.replay == events[3:]
    # ... and an event alone over the budget is not kept either.
    hub._publish(numbered(7, 8 * 1000))
    assert hub.ring_used() == (0, 0) and not hub.replays(events[5].at)
