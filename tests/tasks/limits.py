"""Tasks for the queue-limit tests."""

from __future__ import annotations

import asyncio
from typing import Any

from brook import TaskContext, task


@task("slow_first")
async def slow_first(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Sleep `first` seconds on the first attempt and `then` on later ones, then record the
    attempt in `effects` (so a killed first attempt holds its slot for long)."""
    seconds = payload.get("first", 60) if ctx.attempt == 1 else payload.get("then", 0.1)
    await asyncio.sleep(float(seconds))
    effect = {"job_id": ctx.job_id, "attempt": ctx.attempt}
    await ctx.database()["effects"].insert_one(dict(effect))
    return effect
