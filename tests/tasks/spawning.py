"""Tasks that spawn a tree of jobs with `ctx.submit` (async and plain `def`), one of them
detached, one a durable sleeper: what a cancel of the root reaches."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from brook import SyncTaskContext, TaskContext, task


@task("tree_root")
async def tree_root(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Spawns a branch (which spawns two more), a long job and a durable sleeper, and a
    short detached job; then holds its worker."""
    await ctx.submit("tree_branch")
    await ctx.submit("tree_hold", {"seconds": 60})
    await ctx.submit("tree_sleeper")
    await ctx.submit("tree_hold", {"seconds": float(payload.get("detached_s", 2))}, detach=True)
    await asyncio.sleep(60)


@task("tree_branch")
def tree_branch(payload: dict[str, Any], ctx: SyncTaskContext) -> None:
    ctx.submit("tree_hold", {"seconds": 60})
    ctx.submit("tree_hold", {"seconds": 60})
    time.sleep(60)


@task("tree_hold")
async def tree_hold(payload: dict[str, Any], ctx: TaskContext) -> str:
    await asyncio.sleep(float(payload["seconds"]))
    return "held"


@task("tree_sleeper")
async def tree_sleeper(payload: dict[str, Any], ctx: TaskContext) -> None:
    await ctx.sleep(300)  # pending, without a worker, until then
