"""Tasks for the quota tests."""

from __future__ import annotations

import asyncio
from typing import Any

from brook import RateLimited, Retry, TaskContext, task


@task("quota_sleep")
async def quota_sleep(payload: dict[str, Any]) -> None:
    await asyncio.sleep(float(payload.get("seconds", 0.1)))


@task("quota_default", quotas={"tq": 100})
async def quota_default(payload: dict[str, Any]) -> None:
    await asyncio.sleep(float(payload.get("seconds", 0.0)))


@task("quota_usage")
async def quota_usage(payload: dict[str, Any], ctx: TaskContext) -> int:
    """Report `used` units of `quota` as this attempt's real usage, then sleep `seconds`."""
    await ctx.usage(payload["quota"], int(payload["used"]))
    await asyncio.sleep(float(payload.get("seconds", 0.0)))
    return int(payload["used"])


@task("quota_429")
async def quota_429(payload: dict[str, Any], ctx: TaskContext) -> int:
    """The provider answers 429 on the first `refusals` attempts (Retry-After `delay`)."""
    if ctx.attempt <= int(payload.get("refusals", 1)):
        raise RateLimited(quota=payload["quota"], delay=float(payload.get("delay", 2)))
    return ctx.attempt


@task("quota_step_usage")
async def quota_step_usage(payload: dict[str, Any], ctx: TaskContext) -> int:
    """A paid call in a step that reports its usage; the first attempt then fails, and the
    second replays the step."""

    async def call() -> int:
        await ctx.usage(payload["quota"], int(payload["used"]))
        return int(payload["used"])

    used = int(await ctx.step("call", call))
    if ctx.attempt == 1:
        raise Retry(delay=0)
    return used
