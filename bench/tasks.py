"""The bench's own task (`BROOK_TASKS=bench.tasks`, beside the demo ones): a side effect per
attempt, so that a job run twice shows from outside."""

from __future__ import annotations

from typing import Any

from brook import TaskContext, task


@task("bench_effect")
async def bench_effect(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Record this attempt in `effects` (job id, attempt, the payload's `n`), return it."""
    effect = {"job_id": ctx.job_id, "attempt": ctx.attempt, "n": payload.get("n")}
    await ctx.database()["effects"].insert_one(dict(effect))
    return effect
