"""Brook's task for the `output` scenario (`BROOK_TASKS=bench.output_tasks`): a job that
emits a chunk every 1/`per_s` seconds, on a fixed schedule (no drift), `chunks` in all.
Shared (`shared=1000`): a hundred of them run at once in one shared worker process."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from brook import TaskContext, task

SHARED = 1000


@task("bench_emit", shared=SHARED)
async def bench_emit(payload: dict[str, Any], ctx: TaskContext) -> int:
    chunks, every = int(payload["chunks"]), 1.0 / float(payload["per_s"])
    start = time.monotonic()
    for i in range(chunks):
        await asyncio.sleep(max(0.0, start + i * every - time.monotonic()))
        ctx.emit(f"t{i} ")
    return chunks
