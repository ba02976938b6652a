"""Tasks for workflow tests: each step returns what its parents returned, and when it ran."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from brook import SyncTaskContext, TaskContext, task


@task("step")
async def step(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Sleep `seconds`; return `name`, the parents' results and the times it ran."""
    started = time.time()
    parents = await ctx.parent_results()
    await asyncio.sleep(float(payload.get("seconds", 0)))
    return {"name": payload.get("name"), "parents": parents, "started": started, "ended": time.time()}


@task("step_sync")
def step_sync(payload: dict[str, Any], ctx: SyncTaskContext) -> dict[str, Any]:
    """`step` as a plain `def` (its context's calls block)."""
    started = time.time()
    parents = ctx.parent_results()
    time.sleep(float(payload.get("seconds", 0)))
    return {"name": payload.get("name"), "parents": parents, "started": started, "ended": time.time()}


@task("spawn_dependent")
async def spawn_dependent(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Submit a child of this very job while it runs; it waits for this job to complete."""
    child = await ctx.submit("step", {"name": "child"}, depends_on=[ctx.job_id])
    await asyncio.sleep(float(payload.get("seconds", 0)))
    return {"child": child.id, "status": child.status.value}
