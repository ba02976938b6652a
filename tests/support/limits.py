"""Measuring queue limits from the server's own timestamps.

Every attempt of a job is an interval of its `history`: from the entry that made it
`running` (the claim, stamped with the server's `$$NOW`) to the next entry (its final
write, a retry, a release or a lease expiry, stamped the same way). A killed attempt ends
where its history says it did, not when its worker died. Intervals are half-open, so an
attempt that ends at the very millisecond another starts does not overlap it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True)
class Attempt:
    job_id: str
    attempt: int
    start: datetime
    end: datetime | None  # None: still running


def attempts(docs: Iterable[Mapping[str, Any]]) -> list[Attempt]:
    out: list[Attempt] = []
    for doc in docs:
        history = list(doc.get("history") or [])
        assert not doc.get("history_truncated"), f"{doc['_id']}: history was truncated"
        for i, entry in enumerate(history):
            if entry["status"] != "running":
                continue
            end = history[i + 1]["at"] if i + 1 < len(history) else None
            out.append(Attempt(str(doc["_id"]), int(entry["attempt"]), entry["at"], end))
    return out


def runs(docs: Iterable[Mapping[str, Any]]) -> list[Attempt]:
    """The tasks' own runs, `started_at` to `finished_at`, of the jobs' last attempts (what
    a user reads off the jobs; the dispatcher stamps them, kept within the attempt's lease
    on the server's clock)."""
    return [
        Attempt(str(d["_id"]), int(d["attempts"]), d["started_at"], d.get("finished_at"))
        for d in docs
        if d.get("started_at") is not None
    ]


def max_overlap(spans: Sequence[Attempt]) -> int:
    """The most attempts running at one instant."""
    events: list[tuple[datetime, int]] = []
    for a in spans:
        events.append((a.start.replace(tzinfo=None), 1))
        if a.end is not None:
            events.append((a.end.replace(tzinfo=None), -1))
    # Ends sort before starts at the same instant: half-open intervals.
    events.sort(key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def max_starts_in_window(starts: Iterable[datetime], per_seconds: float) -> int:
    """The most starts in any window `[t, t + per_seconds)`."""
    ordered = sorted(s.replace(tzinfo=None) for s in starts)
    width = timedelta(seconds=per_seconds)
    peak = 0
    j = 0
    for i, start in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] < start + width:
            j += 1
        peak = max(peak, j - i)
    return peak
