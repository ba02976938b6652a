"""The task of the quota benchmark (`bench/quotas.py`): one call to the model API stand-in
whose real usage is 500-2,000 tokens, estimated at 1,000 and corrected by `ctx.usage`.

The HTTP client is made once per event loop, not per call: making an `httpx.AsyncClient`
costs about 25 ms of CPU (it loads the CA bundle), and in a shared worker running a few
hundred of these jobs that blocked every job beside it for seconds, so a start reached the
provider seconds after Brook charged it."""

from __future__ import annotations

import asyncio
import os
import random
import weakref
from typing import Any

import httpx

from brook import RateLimited, Retry, TaskContext, task

MODEL_API = os.environ.get("MODEL_API_URL", "http://127.0.0.1:8900")
QUOTA = os.environ.get("BENCH_QUOTA", "bench-llm")

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


def model_client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
        client = httpx.AsyncClient(base_url=MODEL_API, timeout=300, limits=limits)
        _clients[loop] = client
    return client


@task("bench_llm", shared=200)
async def bench_llm(payload: dict[str, Any], ctx: TaskContext) -> int:
    tokens = int(payload.get("tokens") or random.randint(500, 2000))
    body = {
        "model": "stand-in",
        "max_tokens": tokens - 1,
        "messages": [{"role": "user", "content": "x"}],
        "user": f"{ctx.job_id}/{ctx.attempt}",
    }
    reply = await model_client().post("/v1/chat/completions", json=body)
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
