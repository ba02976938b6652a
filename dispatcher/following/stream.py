"""The change stream: a wake-up signal for new or requeued work and for cancel requests.

It is the fast path, not the only path: the watchdog sweep claims anything an event
never announced. The newest resume token (offered after every `try_next`, empty or not)
is saved by `TokenSaver` with a version of the pipeline it belongs to: a majority write,
coalesced to at most one a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pymongo.errors import OperationFailure, PyMongoError

from brook.common.runtime.backoff import Backoff
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.metrics import STREAM_HISTORY_LOST, STREAM_RESUMES
from brook.common.store.db import is_history_lost
from brook.common.store.jobs import JobStore
from brook.common.store.pipelines import (
    DISPATCHER_PIPELINE,
    DISPATCHER_PIPELINE_VERSION,
    INVALIDATING,
)

STREAM = "dispatcher"  # the `stream` label of this change stream in metrics

OnChange = Callable[[Mapping[str, Any]], None]
OnReset = Callable[[], Awaitable[None]]


class TokenSaver:
    """Saves the newest token after every `try_next`, coalesced: one majority write in flight
    and at most one per `min_interval`, so a busy stream costs about one write a second,
    not one per job. A restart replays at most that second of events, which are only
    wake-ups, and sweeps anyway."""

    def __init__(self, store: JobStore, name: str, min_interval: float = 1.0) -> None:
        self.store = store
        self.name = name
        self.min_interval = min_interval
        self._latest: Mapping[str, Any] | None = None
        self._saved: Mapping[str, Any] | None = None
        self._dirty = asyncio.Event()

    def offer(self, token: Mapping[str, Any] | None) -> None:
        if token is not None and token != self._latest:
            self._latest = token
            self._dirty.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            started = loop.time()
            await self.flush()
            await asyncio.sleep(max(self.min_interval - (loop.time() - started), 0.0))

    async def flush(self) -> None:
        token = self._latest
        if token is None or token == self._saved:
            return
        try:
            await self.store.tokens.save(self.name, DISPATCHER_PIPELINE_VERSION, token)
            self._saved = token
        except PyMongoError as exc:
            log_event(
                Event.MONGO_UNAVAILABLE, level="warning", op="save_token", error=str(exc)[:200]
            )
            self._dirty.set()  # `run` tries again after its interval


class StreamFollower:
    def __init__(
        self,
        store: JobStore,
        name: str,
        saver: TokenSaver,
        on_change: OnChange,
        on_reset: OnReset,
        *,
        max_await_ms: int = 1000,
    ) -> None:
        self.store = store
        self.name = name
        self.saver = saver
        self.on_change = on_change
        self.on_reset = on_reset
        self.max_await_ms = max_await_ms
        self.opened = asyncio.Event()

    async def run(self) -> None:
        token = await self._load_token()
        backoff = Backoff(0.1, 5.0)
        while True:
            try:
                token = await self._follow(token, backoff)
            except OperationFailure as exc:
                if not is_history_lost(exc):
                    log_event(
                        Event.STREAM_ERROR, level="warning", code=exc.code, error=str(exc)[:300]
                    )
                    await asyncio.sleep(backoff.next())
                    continue
                STREAM_HISTORY_LOST.labels(stream=STREAM).inc()
                log_event(
                    Event.STREAM_HISTORY_LOST, level="warning", code=exc.code, error=str(exc)[:300]
                )
                token = None
                await self._drop_token()
                await self.on_reset()
            except PyMongoError as exc:
                log_event(Event.STREAM_ERROR, level="warning", error=str(exc)[:300])
                await asyncio.sleep(backoff.next())

    async def _follow(
        self, token: Mapping[str, Any] | None, backoff: Backoff
    ) -> Mapping[str, Any] | None:
        """Open the stream (resuming after `token`) and follow it; return the token to
        resume from next, None after an invalidation."""
        async with await self.store.changes(
            DISPATCHER_PIPELINE, resume_after=token, max_await_ms=self.max_await_ms
        ) as stream:
            if token is not None:
                STREAM_RESUMES.labels(stream=STREAM).inc()
            log_event(
                Event.STREAM_RESUMED if token is not None else Event.STREAM_OPENED,
                version=DISPATCHER_PIPELINE_VERSION,
            )
            self.opened.set()
            backoff.reset()
            while stream.alive:
                change = await stream.try_next()
                if change is not None and change["operationType"] in INVALIDATING:
                    log_event(Event.STREAM_INVALIDATED, level="warning", op=change["operationType"])
                    await self._drop_token()
                    await self.on_reset()
                    return None
                if change is not None:
                    self.on_change(change)
                token = stream.resume_token
                self.saver.offer(token)
        return token

    async def _load_token(self) -> Mapping[str, Any] | None:
        while True:
            try:
                return await self.store.tokens.load(self.name, DISPATCHER_PIPELINE_VERSION)
            except PyMongoError as exc:
                log_event(
                    Event.MONGO_UNAVAILABLE, level="warning", op="load_token", error=str(exc)[:200]
                )
                await asyncio.sleep(1.0)

    async def _drop_token(self) -> None:
        try:
            await self.store.tokens.drop(self.name)
        except PyMongoError as exc:
            log_event(
                Event.MONGO_UNAVAILABLE, level="warning", op="drop_token", error=str(exc)[:200]
            )
