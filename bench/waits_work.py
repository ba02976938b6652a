"""The workload of the `waits` scenario, the same for Brook, arq and Celery (httpx only: the
peers' virtualenvs import it too).

`sleep`: the job awaits `seconds` of pure I/O (`asyncio.sleep`; `time.sleep` in Celery's
threads). `stream`: the job asks the model API stand-in (`brook.testing.model_api`) for a
streamed chat completion (its tokens over its seconds) and reads the stream to the end;
the count of content chunks is its result. Each process (each event loop) keeps one HTTP
client for all its jobs, its connection pool unbounded, as a real pipeline would: a client
a job costs each job an SSL context (~25 ms of CPU, and memory) for nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx

BODY = {"model": "stand-in", "messages": [{"role": "user", "content": "wait"}], "stream": True}
TIMEOUT = httpx.Timeout(120.0)
LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=2000)
RETRIES = 3
_async: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None
_sync: httpx.Client | None = None
_lock = threading.Lock()


def _async_client() -> httpx.AsyncClient:
    global _async
    loop = asyncio.get_running_loop()
    if _async is None or _async[0] is not loop:
        _async = (loop, httpx.AsyncClient(timeout=TIMEOUT, limits=LIMITS))
    return _async[1]


def _sync_client() -> httpx.Client:
    global _sync
    with _lock:
        if _sync is None:
            _sync = httpx.Client(timeout=TIMEOUT, limits=LIMITS)
        return _sync


def _tokens(line: str) -> int:
    if not line.startswith("data:") or line == "data: [DONE]":
        return 0
    chunk = json.loads(line[5:])
    return sum(1 for c in chunk.get("choices", []) if c.get("delta", {}).get("content"))


async def stream_async(url: str) -> int:
    """One streamed completion read to its end with an `httpx.AsyncClient`: tokens read."""
    for attempt in range(RETRIES):
        tokens = 0
        try:
            async with _async_client().stream(
                "POST", f"{url}/v1/chat/completions", json=BODY
            ) as resp:
                resp.raise_for_status()
                async for line in resp.aiter_lines():
                    tokens += _tokens(line)
            return tokens
        except httpx.TransportError:
            if tokens or attempt == RETRIES - 1:
                raise
    raise AssertionError("not reached")


def stream_sync(url: str) -> int:
    """The same with an `httpx.Client` (Celery's threads)."""
    for attempt in range(RETRIES):
        tokens = 0
        try:
            with _sync_client().stream("POST", f"{url}/v1/chat/completions", json=BODY) as resp:
                resp.raise_for_status()
                for line in resp.iter_lines():
                    tokens += _tokens(line)
            return tokens
        except httpx.TransportError:
            if tokens or attempt == RETRIES - 1:
                raise
    raise AssertionError("not reached")


async def work_async(mode: str, seconds: float, url: str) -> int:
    if mode == "sleep":
        await asyncio.sleep(seconds)
        return 0
    return await stream_async(url)


def work_sync(mode: str, seconds: float, url: str) -> int:
    if mode == "sleep":
        time.sleep(seconds)
        return 0
    return stream_sync(url)
