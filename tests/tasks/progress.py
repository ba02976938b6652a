"""Tasks that report progress (`BROOK_TASKS=tests.tasks.basic,tests.tasks.progress`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from brook import TaskContext, task


def _step_seconds(payload: dict[str, Any], ctx: TaskContext) -> float:
    """`seconds` for the whole first attempt, `later_seconds` for any later one."""
    total = payload.get("seconds", 2.0) if ctx.attempt == 1 else payload.get("later_seconds", 2.0)
    return float(total) / int(payload.get("steps", 10))


@task("steps")
def steps(payload: dict[str, Any], ctx: TaskContext) -> int:
    """A plain `def`: `steps` steps, reporting after each one."""
    n = int(payload.get("steps", 10))
    pause = _step_seconds(payload, ctx)
    for i in range(1, n + 1):
        time.sleep(pause)
        ctx.progress(i / n, f"attempt {ctx.attempt} step {i}/{n}")
    return n


@task("steps_async")
async def steps_async(payload: dict[str, Any], ctx: TaskContext) -> int:
    """The same as an `async def`."""
    n = int(payload.get("steps", 10))
    pause = _step_seconds(payload, ctx)
    for i in range(1, n + 1):
        await asyncio.sleep(pause)
        ctx.progress(i / n, f"attempt {ctx.attempt} step {i}/{n}")
    return n


@task("chatty")
def chatty(payload: dict[str, Any], ctx: TaskContext) -> int:
    """Reports as fast as it can for `seconds`: the writes must stay a few a second."""
    deadline = time.monotonic() + float(payload.get("seconds", 2.0))
    calls = 0
    while time.monotonic() < deadline:
        calls += 1
        ctx.progress(min(calls / 1_000_000, 1.0), f"call {calls}")
    return calls
