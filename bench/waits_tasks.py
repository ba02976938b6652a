"""Brook's tasks for the `waits` scenario (`BROOK_TASKS=bench.waits_tasks`): jobs that only
wait, declared shared (`shared=1000`, the defaults otherwise: one shared worker process)."""

from __future__ import annotations

from typing import Any

from bench.waits_work import work_async
from brook import TaskContext, task

SHARED = 1000


@task("bench_wait", shared=SHARED)
async def bench_wait(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """`payload`: `mode` (`sleep` or `stream`), `seconds`, `url` (the model API stand-in)."""
    tokens = await work_async(
        str(payload["mode"]), float(payload["seconds"]), str(payload.get("url", ""))
    )
    return {"tokens": tokens}
