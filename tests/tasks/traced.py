"""Tasks for the tracing tests (`BROOK_TASKS=tests.tasks.basic,tests.tasks.traced`): a task
that runs a durable step and submits a child job with `ctx.submit`, and a trigger on
`traced_orders`."""

from __future__ import annotations

from typing import Any

from brook import TaskContext, task, trigger


@task("traced_parent")
async def traced_parent(payload: dict[str, Any], ctx: TaskContext) -> str:
    await ctx.step("prepare", lambda: {"ready": True})
    child = await ctx.submit("echo", {"parent": ctx.job_id})
    return child.id


trigger("traced-orders", collection="traced_orders", operations=["insert"], task="echo")
