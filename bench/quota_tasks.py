"""The task of the quota benchmark (`bench/quotas.py`): one call to the model API stand-in
whose real usage is 500-2,000 tokens, estimated at 1,000 and corrected by `ctx.usage`."""

from __future__ import annotations

import os
import random
from typing import Any

import httpx

from brook import RateLimited, Retry, TaskContext, task

MODEL_API = os.environ.get("MODEL_API_URL", "http://127.0.0.1:8900")
QUOTA = os.environ.get("BENCH_QUOTA", "bench-llm")


@task("bench_llm", shared=200)
async def bench_llm(payload: dict[str, Any], ctx: TaskContext) -> int:
    tokens = int(payload.get("tokens") or random.randint(500, 2000))
    body = {
        "model": "stand-in",
        "max_tokens": tokens - 1,
        "messages": [{"role": "user", "content": "x"}],
        "user": f"{ctx.job_id}/{ctx.attempt}",
    }
    async with httpx.AsyncClient(base_url=MODEL_API, timeout=300) as client:
        reply = await client.post("/v1/chat/completions", json=body)
    if reply.status_code == 429:
        delay = float(reply.headers.get("retry-after-ms", "1000")) / 1000
        if payload.get("quota", True):
            raise RateLimited(quota=QUOTA, delay=delay)
        raise Retry(delay=delay)
    reply.raise_for_status()
    used = int(reply.json()["usage"]["total_tokens"])
    if payload.get("quota", True):
        await ctx.usage(QUOTA, used)
    return used
