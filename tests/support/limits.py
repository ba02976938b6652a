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
    return _peak(events)


def _peak(events: list[tuple[Any, int]]) -> int:
    # Ends sort before starts at the same instant: half-open intervals.
    events.sort(key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


# -- in commit order ------------------------------------------------------------------------
#
# A history entry's `at` is the server's clock when its write began (`$$NOW`), not when it
# committed: a write that waits (a write conflict retried, a busy host) commits later than
# its stamp says. Two writes that exclude each other (a claim taking the key slot that a
# completion frees, in one unique index) are ordered by their commits, and may be stamped
# the other way round by a few milliseconds. What the database held at once is read in the
# order of its oplog: the change stream's `clusterTime` of each status change.

Order = tuple[int, int]  # an oplog timestamp: (seconds, increment)


@dataclass(frozen=True)
class Change:
    job_id: str
    status: str
    order: Order


def status_change(event: Mapping[str, Any]) -> Change | None:
    """The status change a change-stream event of the jobs collection tells, if any."""
    fields = (event.get("updateDescription") or {}).get("updatedFields") or {}
    status = fields.get("status")
    if event.get("operationType") != "update" or status is None:
        return None
    ts = event["clusterTime"]
    return Change(str(event["documentKey"]["_id"]), str(status), (ts.time, ts.inc))


def running_in_commit_order(changes: Iterable[Change]) -> list[tuple[str, Order, Order | None]]:
    """Each job's runs, from a change that made it `running` to its next change of status
    (None: still running), in commit order."""
    by_job: dict[str, list[Change]] = {}
    for c in changes:
        by_job.setdefault(c.job_id, []).append(c)
    spans: list[tuple[str, Order, Order | None]] = []
    for job_id, mine in by_job.items():
        mine.sort(key=lambda c: c.order)
        for i, c in enumerate(mine):
            if c.status == "running":
                end = mine[i + 1].order if i + 1 < len(mine) else None
                spans.append((job_id, c.order, end))
    return spans


def max_overlap_committed(spans: Sequence[tuple[str, Order, Order | None]]) -> int:
    """The most jobs running at once in the database, in commit order."""
    events: list[tuple[Any, int]] = []
    for _, start, end in spans:
        events.append((start, 1))
        if end is not None:
            events.append((end, -1))
    return _peak(events)


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
