"""Live statistics: counts per time bucket and wait percentiles."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from brook.ingest.live import tally
from brook.ingest.livestats import STEP_S, LiveStats


def update(wall_s: float, **fields: Any) -> dict[str, Any]:
    """A change event as the hub reads it: the fields one update set, and the post-image's
    `run_at`."""
    wall = datetime.fromtimestamp(wall_s, UTC)
    return {
        "operationType": "update",
        "wallTime": wall,
        "updateDescription": {"updatedFields": fields},
        "fullDocument": {"run_at": wall - timedelta(seconds=1)},
    }


def test_live_stats_count_per_bucket_and_wait_percentiles() -> None:
    now = 10_005.0
    stats = LiveStats(clock=lambda: now)
    started = datetime.fromtimestamp(now - 1, UTC)
    changes = [
        update(now - 1, status="running", claimed_at=started),  # a claim: not a start
        update(now - 1, started_at=started - timedelta(seconds=0.75)),  # the start: 250 ms
        update(now - 1, progress={"fraction": 0.5}),  # progress: neither
        update(now - 1, status="completed", finished_at=started),
        update(now - 1, status="completed", started_at=started),  # started and ended at once
        update(now - STEP_S - 1, status="failed"),
        update(now - 1, status="pending", started_at=None),  # a retry: neither
        {"operationType": "insert", "fullDocument": {"status": "pending"}},
    ]
    for change in changes:
        if (counted := tally(change)) is not None:
            stats.observe(counted)
    series = stats.series()
    assert series["started"][-1] == 2 and series["completed"][-1] == 2
    assert series["failed"][-2] == 1 and series["wait_p50_ms"][-1] == 1000.0
    assert sorted(t.wait_ms or 0 for c in changes[1:2] if (t := tally(c))) == [250.0]
    assert series["end"] == (int(now // STEP_S) + 1) * STEP_S
