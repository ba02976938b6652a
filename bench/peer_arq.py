"""arq's side of the `waits` scenario: one worker process, `max_jobs=1000`, arq's defaults
otherwise (`arq bench.peer_arq.WorkerSettings`, from the peers' `venv-arq`)."""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aredis
from arq.connections import RedisSettings

from bench.waits_work import work_async

REDIS = RedisSettings(host="127.0.0.1", port=6390, database=7)
SIDE_URL = "redis://127.0.0.1:6390/9"
KEY = "waits:done"


async def wait(ctx: dict[str, Any], mode: str, seconds: float, url: str) -> int:
    start = time.time()
    try:
        tokens = await work_async(mode, seconds, url)
    except Exception:  # recorded as failed (-1): the driver counts it, does not wait for it
        tokens = -1
    await ctx["side"].rpush(KEY, f"{start!r} {time.time()!r} {tokens}")
    return tokens


async def startup(ctx: dict[str, Any]) -> None:
    ctx["side"] = aredis.Redis.from_url(SIDE_URL)


async def shutdown(ctx: dict[str, Any]) -> None:
    await ctx["side"].aclose()


class WorkerSettings:
    functions = [wait]
    redis_settings = REDIS
    on_startup = startup
    on_shutdown = shutdown
    max_jobs = 1000
