"""Watching Brook live without a database: a token's cluster time, event filters."""

from __future__ import annotations

from brook.ingest.live import EventFilter, LiveEvent, Position, cluster_seconds

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
