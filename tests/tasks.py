"""Tasks for tests: side effects recorded as (job_id, attempt) so duplicates can be counted."""

from __future__ import annotations

import asyncio
from typing import Any

from common.errors import Retry
from executor.context import SyncTaskContext, TaskContext
from executor.registry import task


@task("record")
async def record(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Sleep `seconds` (a number, or a list: one per attempt), then record this attempt in
    `effects` and return it."""
    seconds = payload.get("seconds", 0)
    if isinstance(seconds, list):
        seconds = seconds[min(ctx.attempt, len(seconds)) - 1]
    await asyncio.sleep(float(seconds))
    effect = {"job_id": ctx.job_id, "attempt": ctx.attempt, "n": payload.get("n")}
    await ctx.database()["effects"].insert_one(dict(effect))
    return effect


@task("retry_once")
def retry_once(payload: dict[str, Any], ctx: SyncTaskContext) -> str:
    if ctx.attempt == 1:
        raise Retry(delay=float(payload.get("delay", 0.3)))
    return "second time lucky"


@task("flaky")
def flaky(payload: dict[str, Any], ctx: SyncTaskContext) -> int:
    """Fails until attempt `succeed_on`."""
    if ctx.attempt < int(payload.get("succeed_on", 2)):
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    return ctx.attempt


@task("huge_result")
def huge_result(payload: dict[str, Any]) -> str:
    return "x" * (9 * 1024 * 1024)
