"""The server's own account of a query: an aggregation on the jobs collection explained
with its execution statistics, and what it read."""

from __future__ import annotations

import re
from typing import Any

from brook.common.store.jobs import JobStore


async def explain_aggregate(store: JobStore, pipeline: list[dict[str, Any]], hint: str) -> str:
    """The plan of `pipeline` on the jobs collection, hinted to `hint`, as run
    (`executionStats`), as text to search."""
    stats = await store.db.command(
        "explain",
        {"aggregate": "jobs", "pipeline": pipeline, "hint": hint, "cursor": {}},
        verbosity="executionStats",
    )
    return str(stats)


def keys_examined(plan: str) -> int:
    """The index keys the plan's execution examined (its first `totalKeysExamined`)."""
    [n] = [int(n) for n in re.findall(r"'totalKeysExamined': (\d+)", plan)][:1]
    return n
