"""Tasks whose jobs share worker processes (`shared=`), for tests/e2e/test_shared.py."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from brook import TaskContext, task


@task("shared_wait", shared=100)
async def shared_wait(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Waits `seconds` (on attempt 1; `later` seconds after), then records one effect row
    (job and attempt) and returns its `n`."""
    seconds = float(payload.get("seconds", 0.1) if ctx.attempt == 1 else payload.get("later", 0))
    ctx.log.info("shared.waiting", seconds=seconds)
    await asyncio.sleep(seconds)
    await ctx.database()["effects"].insert_one({"job_id": ctx.job_id, "attempt": ctx.attempt})
    return {"n": payload.get("n"), "job": ctx.job_id}


@task("shared_steps", shared=10)
async def shared_steps(payload: dict[str, Any], ctx: TaskContext) -> list[int]:
    """Five steps, each inserting one effect row; on attempt 1, step `hold_in` waits before
    its insert (a test kills the process meanwhile)."""
    effects = ctx.database()["effects"]

    async def effect(n: int) -> int:
        if ctx.attempt == 1 and n == payload.get("hold_in"):
            ctx.log.info("step.holding", step=n)
            await asyncio.sleep(60)
        await effects.insert_one({"job_id": ctx.job_id, "step": n, "attempt": ctx.attempt})
        return n

    return [await ctx.step(f"step-{n}", effect, n) for n in range(1, 6)]


@task("shared_block", shared=10)
async def shared_block(payload: dict[str, Any]) -> str:
    """Blocks its process's event loop for `seconds` (what a shared task must not do)."""
    time.sleep(float(payload.get("seconds", 1.0)))
    return "blocked"


@task("shared_crash", shared=10)
async def shared_crash(payload: dict[str, Any], ctx: TaskContext) -> int:
    """Kills its own process on its first `times` attempts (and every neighbour with it)."""
    if ctx.attempt <= int(payload.get("times", 2)):
        os._exit(70)
    return ctx.attempt


@task("shared_order", shared=50)
async def shared_order(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """In the attempt's own transaction, beside its neighbours' own: its row in `orders` and
    a follow-up job, with progress reported while the transaction is open."""
    async with ctx.transaction() as session:
        await ctx.database()["orders"].insert_one({"job_id": ctx.job_id}, session=session)
        await asyncio.sleep(0.2)  # the neighbours' transactions are open meanwhile
        await ctx.submit("noop", {"after": ctx.job_id}, session=session)
        ctx.progress(0.5, "row written")
    return {"job": ctx.job_id}


@task("shared_sleeper", shared=20)
async def shared_sleeper(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Sleeps durably, then waits for the signal on its `key`: neither holds a seat."""
    await ctx.sleep(float(payload.get("sleep", 1.5)))  # over 1 s: the run ends to sleep
    return {"signal": await ctx.wait_for_signal(payload["key"])}


_LEAKED: list[bytearray] = []  # what `shared_leak` keeps, as a leak in user code would


@task("shared_leak", shared=100)
async def shared_leak(payload: dict[str, Any], ctx: TaskContext) -> int:
    """Keeps `mib` MiB (touched, so resident) in its process after it returns; returns the
    pid of that process."""
    _LEAKED.append(bytearray(b"\x01") * (int(payload["mib"]) * 2**20))
    return os.getpid()
