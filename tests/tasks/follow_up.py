"""Tasks that submit follow-up jobs through `ctx.submit` (sync and async forms)."""

from __future__ import annotations

from typing import Any

from brook import SyncTaskContext, TaskContext, task


@task("spawn_async")
async def spawn_async(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    child = await ctx.submit(
        "echo", {"parent": ctx.job_id}, queue=payload.get("queue", "default"), priority=5
    )
    return {"child": child.id, "status": child.status.value}


@task("spawn_sync")
def spawn_sync(payload: dict[str, Any], ctx: SyncTaskContext) -> dict[str, Any]:
    child = ctx.submit("echo", {"parent": ctx.job_id}, idempotency_key=f"child-of-{ctx.job_id}")
    again = ctx.submit("echo", {"parent": ctx.job_id}, idempotency_key=f"child-of-{ctx.job_id}")
    return {"child": child.id, "same": again.id == child.id}


@task("spawn_unknown")
async def spawn_unknown(payload: dict[str, Any], ctx: TaskContext) -> None:
    await ctx.submit("no_such_task")  # refused: live dispatchers do not run it
