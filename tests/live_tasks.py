"""Tasks for the live-event tests.

`steps` reports progress by writing the job's `progress` field itself, in the shape the
contract gives it (`{fraction, message, at}`); once tasks have `ctx.progress` it is the
same change to the same document, and this task can call that instead.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from executor.context import TaskContext
from executor.registry import task


@task("steps")
async def steps(payload: dict[str, Any], ctx: TaskContext) -> dict[str, int]:
    n = int(payload.get("steps", 3))
    for i in range(1, n + 1):
        await asyncio.sleep(float(payload.get("seconds", 0.2)))
        progress = {"fraction": i / n, "message": f"step {i} of {n}", "at": datetime.now(UTC)}
        await ctx.database()["jobs"].update_one(
            {"_id": ctx.job_id, "attempts": ctx.attempt, "status": "running"},
            {"$set": {"progress": progress}},
        )
    return {"steps": n}
