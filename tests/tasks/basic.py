"""Tasks for tests: side effects recorded as (job_id, attempt) so duplicates can be counted."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from brook import Retry, SyncTaskContext, TaskContext, task


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


# -- transactional tasks: the row in `orders` and the follow-up job commit with completion ------


@task("order")
async def order(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """In the attempt's own transaction: its row in `orders` and a follow-up job. Holds
    (sleeps) inside the transaction on the attempts listed in `hold_on`."""
    async with ctx.transaction() as session:
        row = {"job_id": ctx.job_id, "attempt": ctx.attempt}
        await ctx.database()["orders"].insert_one(row, session=session)
        await ctx.submit("noop", {"after": ctx.job_id}, session=session)
        ctx.progress(0.5, "row written")
        ctx.log.info("order.written")
        if ctx.attempt in payload.get("hold_on", []):
            await asyncio.sleep(float(payload.get("hold", 30)))
    return {"attempt": ctx.attempt}


@task("order_sync")
def order_sync(payload: dict[str, Any], ctx: SyncTaskContext) -> dict[str, Any]:
    """`order` as a plain `def` task, with a blocking session."""
    with ctx.transaction() as session:
        row = {"job_id": ctx.job_id, "attempt": ctx.attempt}
        ctx.database()["orders"].insert_one(row, session=session)
        ctx.submit("noop", {"after": ctx.job_id}, session=session)
        ctx.progress(0.5, "row written")
        ctx.log.info("order.written")
        if ctx.attempt in payload.get("hold_on", []):
            time.sleep(float(payload.get("hold", 30)))
    return {"attempt": ctx.attempt}


@task("order_then_fail")
async def order_then_fail(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Writes its row in its transaction, then raises: nothing of it may remain."""
    async with ctx.transaction() as session:
        await ctx.database()["orders"].insert_one({"job_id": ctx.job_id}, session=session)
    raise RuntimeError("failed after writing")
