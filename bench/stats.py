"""Small, dependency-free statistics for the benchmark figures."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

PCTS = (50.0, 95.0, 99.0)


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `values` need not be sorted."""
    if not values:
        return math.nan
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    rank = (len(data) - 1) * pct / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    return data[lo] + (data[hi] - data[lo]) * (rank - lo)


def dist(values: Sequence[float]) -> dict[str, float]:
    """n, mean, p50/p95/p99, min and max of `values` (milliseconds, rounded to 0.01)."""
    out: dict[str, float] = {"n": len(values)}
    if not values:
        return out
    out["mean"] = round(sum(values) / len(values), 2)
    out["min"] = round(min(values), 2)
    for pct in PCTS:
        out[f"p{pct:g}"] = round(percentile(values, pct), 2)
    out["max"] = round(max(values), 2)
    return out


def ms(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds() * 1000.0


@dataclass(frozen=True, kw_only=True)
class JobTimes:
    """The server-clock stamps of one finished job (millisecond precision, BSON dates)."""

    id: str
    status: str
    attempts: int
    created: datetime
    started: datetime | None
    finished: datetime | None

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> JobTimes:
        return cls(
            id=str(doc["_id"]),
            status=str(doc["status"]),
            attempts=int(doc.get("attempts", 0)),
            created=doc["created_at"],
            started=doc.get("started_at"),
            finished=doc.get("finished_at"),
        )


def anomalies(jobs: Iterable[JobTimes]) -> dict[str, Any]:
    """Every job that did not end `completed` with `attempts == 1`, counted and sampled."""
    bad = [j for j in jobs if j.status != "completed" or j.attempts != 1]
    kinds = Counter(f"{j.status}/attempts={j.attempts}" for j in bad)
    return {"count": len(bad), "kinds": dict(kinds), "sample_ids": [j.id for j in bad[:10]]}


def max_overlap(jobs: Iterable[JobTimes]) -> int:
    """Most jobs running at once by their stamps (ends sort before starts at equal times)."""
    edges: list[tuple[datetime, int]] = []
    for j in jobs:
        if j.started is not None and j.finished is not None:
            edges += [(j.started, 1), (j.finished, -1)]
    edges.sort()
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def gaps_ms(stamps: Iterable[datetime]) -> list[float]:
    """Differences between consecutive sorted stamps, in ms."""
    ordered = sorted(stamps)
    return [ms(b, a) for a, b in itertools.pairwise(ordered)]


def per_second(stamps: Iterable[datetime], origin: datetime) -> list[int]:
    """How many stamps fall in each whole second after `origin`."""
    counts: Counter[int] = Counter(int((s - origin).total_seconds()) for s in stamps)
    if not counts:
        return []
    return [counts.get(i, 0) for i in range(max(counts) + 1)]
