"""Tasks that emit output (`ctx.emit`), for tests/e2e/test_output.py."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from brook import OutputLimitExceeded, SyncTaskContext, TaskContext, task


async def _tokens(payload: dict[str, Any], ctx: TaskContext) -> int:
    n, pause = int(payload.get("n", 20)), float(payload.get("pause", 0.01))
    for i in range(n):
        ctx.emit(f"t{i} ")
        await asyncio.sleep(pause)
    ctx.emit({"done": n, "attempt": ctx.attempt})
    return n


@task("emit_tokens")
async def emit_tokens(payload: dict[str, Any], ctx: TaskContext) -> int:
    """`n` text chunks `pause` s apart, then one JSON chunk."""
    return await _tokens(payload, ctx)


@task("emit_tokens_shared", shared=10)
async def emit_tokens_shared(payload: dict[str, Any], ctx: TaskContext) -> int:
    """`emit_tokens`, in a shared worker process."""
    return await _tokens(payload, ctx)


@task("emit_tokens_sync")
def emit_tokens_sync(payload: dict[str, Any], ctx: SyncTaskContext) -> int:
    """`emit_tokens` as a plain `def` (on its worker's thread)."""
    n, pause = int(payload.get("n", 20)), float(payload.get("pause", 0.01))
    for i in range(n):
        ctx.emit(f"t{i} ")
        time.sleep(pause)
    ctx.emit({"done": n, "attempt": ctx.attempt})
    return n


@task("emit_until_killed")
async def emit_until_killed(payload: dict[str, Any], ctx: TaskContext) -> str:
    """Attempt 1 emits `n` chunks (`pause` s apart), says so in its log, and waits to be
    killed; a later attempt emits `later` chunks and returns."""
    if ctx.attempt == 1:
        for i in range(int(payload.get("n", 5))):
            ctx.emit(f"a1-{i} ")
            await asyncio.sleep(float(payload.get("pause", 0)))
        await asyncio.sleep(0.3)  # past a window: its chunks are written
        ctx.log.info("output.holding", pid=os.getpid())
        await asyncio.sleep(60)
    for i in range(int(payload.get("later", 3))):
        ctx.emit(f"a{ctx.attempt}-{i} ")
    return "done"


@task("emit_in_step")
async def emit_in_step(payload: dict[str, Any], ctx: TaskContext) -> str:
    """A step that streams its answer; attempt 1 then dies (after the step's checkpoint);
    attempt 2 replays the step (emitting nothing) and emits after it."""

    async def answer() -> str:
        words = ["the", "answer", "is", "42"]
        for w in words:
            ctx.emit(w + " ")
            await asyncio.sleep(0.01)
        return " ".join(words)

    text = await ctx.step("answer", answer)
    if ctx.attempt == 1:
        ctx.log.info("output.holding", pid=os.getpid())
        await asyncio.sleep(60)
    ctx.emit({"attempt": ctx.attempt, "after": "the step"})
    return str(text)


@task("emit_many")
def emit_many(payload: dict[str, Any], ctx: SyncTaskContext) -> dict[str, Any]:
    """Emits `n` chunks as fast as it can; past the cap, says where it stopped."""
    for i in range(int(payload.get("n", 10_000))):
        try:
            ctx.emit(i)
        except OutputLimitExceeded as exc:
            return {"emitted": i, "error": str(exc)}
    return {"emitted": int(payload.get("n", 10_000)), "error": None}


@task("emit_then_commit")
async def emit_then_commit(payload: dict[str, Any], ctx: TaskContext) -> int:
    """`n` chunks 50 ms apart (past its first batch, a count is not written with each), then
    its completion in its own transaction."""
    n = int(payload.get("n", 5))
    for i in range(n):
        ctx.emit(f"c{i} ")
        await asyncio.sleep(0.05)
    async with ctx.transaction() as session:
        await ctx.database()["orders"].insert_one({"job_id": ctx.job_id}, session=session)
    return n
