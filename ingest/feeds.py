"""One client's event stream: what it missed (replayed from memory, or caught up from the
oplog), then live events, as server-sent events.

Every event is `event: job` with the job as its data and an `id:` that resumes right
after it. While nothing happens, the feed sends an id-only line from time to time: it
moves the client's Last-Event-ID forward without an event (browsers and SSE clients
keep it), so a client whose filter matches nothing for hours still resumes from a recent
point. When the client's history is no longer in the oplog it gets `event: reset`, then
the current state of the jobs it watches (changed since its last event), then live ones.

An event's job comes without its payload and result; a feed asked for them (`include`)
reads them for each event it sends, one job at a time, and adds them to its text.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pymongo.errors import PyMongoError
from sse_starlette import ServerSentEvent

from brook.common.domain.errors import SearchTooBroad
from brook.common.domain.models import Doc
from brook.common.domain.status import JobStatus
from brook.common.runtime.log_events import Event, log_event
from brook.common.store.jobs import JobStore
from brook.common.store.pipelines import EVENT_PROJECTION
from brook.ingest.caps import Slots
from brook.ingest.encoding import dumps
from brook.ingest.eventids import EventIds
from brook.ingest.live import (
    Closed,
    EventFilter,
    Hub,
    LiveEvent,
    Position,
    Reset,
    Subscription,
    catch_up,
    cluster_time,
    live_event,
)
from brook.ingest.metrics import SSE_CATCH_UPS, SSE_RESETS

SEP = "\n"  # plain lines: `grep '^id:'` in a shell gets an id without a stray CR
RESET_SLACK_MS = 5000  # clocks differ: after a reset, send a little more rather than less
RESET_LIMIT = 500  # jobs sent as the current state after a reset, at most
JOB_EVENT = "job"
RESET_EVENT = "reset"
UNKNOWN_ID = "unknown_id"  # a reset's reason: the client's Last-Event-ID is none of ours


def _sse(**fields: Any) -> ServerSentEvent:
    return ServerSentEvent(sep=SEP, **fields)


@dataclass(frozen=True, kw_only=True)
class FeedOptions:
    per_job: bool  # starts with the current state, skips repeats, ends after a terminal state
    idle_s: float  # how often an idle feed moves the client's Last-Event-ID forward
    include: frozenset[str] = frozenset()  # of `payload` and `result`: read per job, added


class Feed:
    def __init__(
        self,
        hub: Hub,
        store: JobStore,
        flt: EventFilter,
        options: FeedOptions,
        ids: EventIds,
        catch_ups: Slots | None = None,
    ) -> None:
        self.hub = hub
        self.ids = ids
        self.catch_ups = catch_ups
        self.store = store
        self.filter = flt
        self.options = options
        self.done = False
        self._last_data: str | None = None
        self._floor = ""  # the client has everything up to here: never send an id before it
        self._read_at: tuple[int, int] | None = None  # the current state sent holds all to here

    async def events(
        self, since: Position | None, *, unreadable: str | None = None
    ) -> AsyncGenerator[ServerSentEvent, None]:
        """Subscribe now (so nothing is missed from here on), then stream. `unreadable`: why
        the client's `Last-Event-ID` named no position this API can resume from (the
        stream says so with a `reset`, then starts afresh)."""
        if self.hub.position is None:  # the hub restarted since this request was accepted
            yield _sse(comment="closing: the event stream is restarting; reconnect")
            return
        if since is not None:
            self._floor = since.key
        sub = self.hub.subscribe(self.filter, since)
        try:
            if unreadable is not None:
                yield self._unreadable(sub.start, unreadable)
            async for sse in self._stream(sub, since):
                yield sse
        except Closed as exc:
            yield _sse(comment=f"closing: {exc}; reconnect with Last-Event-ID")
        except PyMongoError as exc:
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op="events", error=str(exc)[:200])
            yield _sse(
                comment="closing: database unavailable; reconnect with Last-Event-ID"
            )
        finally:
            self.hub.unsubscribe(sub)

    async def _stream(
        self, sub: Subscription, since: Position | None
    ) -> AsyncIterator[ServerSentEvent]:
        if since is None and self.options.per_job:
            async for sse in self._current_state(sub.start, reset=None):
                yield sse
        elif since is not None:
            async for sse in self._missed(sub, since):
                yield sse
        while not self.done:
            event = await sub.next(self.options.idle_s)
            if event is not None:
                async for sse in self._send(event):
                    yield sse
                continue
            # Nothing queued: every matching event up to the hub's position has been sent.
            position = self.hub.position
            if position is not None and position.key > self._floor:
                self._floor = position.key
                yield _sse(id=self.ids.encode(position))

    async def _missed(self, sub: Subscription, since: Position) -> AsyncIterator[ServerSentEvent]:
        if sub.replay is not None:
            for event in sub.replay:
                async for sse in self._send(event):
                    yield sse
                if self.done:
                    return
            return
        # A cursor of its own (and, after a reset, a read of what changed since): at most
        # `BROOK_SSE_MAX_CATCH_UPS` at once per process. The route refused a client with
        # 503 when they were all taken; one that slipped in since is asked to come back.
        if self.catch_ups is not None and not self.catch_ups.take():
            yield _sse(comment="closing: too many catch-ups at once; reconnect shortly")
            self.done = True
            return
        try:
            SSE_CATCH_UPS.inc()
            async for item in catch_up(self.store, sub, since):
                if isinstance(item, Reset):
                    async for sse in self._current_state(sub.start, reset=item):
                        yield sse
                    return
                async for sse in self._send(item):
                    yield sse
                if self.done:
                    return
        finally:
            if self.catch_ups is not None:
                self.catch_ups.give()

    async def _send(
        self, event: LiveEvent, *, current: bool = False
    ) -> AsyncIterator[ServerSentEvent]:
        event_id = self._job(event, current=current)
        if event_id is not None:
            yield _sse(data=await self._included(event), event=JOB_EVENT, id=event_id)

    def _job(self, event: LiveEvent, *, current: bool = False) -> str | None:
        """The id to send `event` with, or None when this client is not to get it."""
        if self.done or (self.options.per_job and event.data == self._last_data):
            return None
        at = cluster_time(event.at.key)
        if not current and self._read_at is not None and at is not None and at <= self._read_at:
            return None  # a change older than the current state this client was sent
        self._last_data = event.data
        final = self.options.per_job and event.terminal
        self.done = final
        self._floor = max(self._floor, event.at.key)
        return self.ids.encode(event.at, final=final)

    async def _included(self, event: LiveEvent) -> str:
        """The event's text, with the fields this client asked for as the job holds them
        now (a job deleted since goes without them)."""
        if not self.options.include:
            return event.data
        doc = await self.store.job_doc(event.job_id, {name: 1 for name in self.options.include})
        if doc is None:
            return event.data
        extra = {name: doc.get(name) for name in sorted(self.options.include)}
        if "payload" in extra:
            extra["payload"] = extra["payload"] or {}  # as `Job` reads it
        return f"{event.data[:-1]},{dumps(extra)[1:]}"  # both are JSON objects

    def _unreadable(self, at: Position, why: str) -> ServerSentEvent:
        SSE_RESETS.inc()
        log_event(Event.SSE_RESET, level="warning", reason=UNKNOWN_ID, job_id=self.filter.job_id)
        body = {"reason": UNKNOWN_ID, "since": None, "detail": why}
        return _sse(data=json.dumps(body), event=RESET_EVENT, id=self.ids.encode(at))

    async def _current_state(
        self, at: Position, reset: Reset | None
    ) -> AsyncIterator[ServerSentEvent]:
        """The jobs as they are now, with the position `at` (events after it follow)."""
        if reset is not None:
            SSE_RESETS.inc()
            log_event(
                Event.SSE_RESET, level="warning", reason=reset.reason, job_id=self.filter.job_id
            )
            since = datetime.fromtimestamp((reset.since_ms - RESET_SLACK_MS) / 1000, UTC)
            body = {"reason": reset.reason, "since": since.isoformat()}
            yield _sse(data=json.dumps(body), event=RESET_EVENT, id=self.ids.encode(at))
        for doc in await self._now(reset):
            async for sse in self._send(live_event(at, doc), current=True):
                yield sse

    async def _now(self, reset: Reset | None) -> list[Doc]:
        f = self.filter
        if f.job_id is not None:
            # Events from the hub's position on follow, and the hub may lag: those older
            # than this read are in it already, and are not sent again.
            doc, read_at = await self.store.job_doc_now(f.job_id, EVENT_PROJECTION)
            if read_at is not None:
                self._read_at = (read_at.time, read_at.inc)
            return [doc] if doc is not None else []
        if reset is None:  # a feed of many jobs has no "current state" but after a reset
            return []
        try:
            return await self.store.changed_since(
                datetime.fromtimestamp((reset.since_ms - RESET_SLACK_MS) / 1000, UTC),
                queue=f.queue,
                task=f.task,
                status=JobStatus(f.status) if f.status else None,
                limit=RESET_LIMIT,
                projection=EVENT_PROJECTION,
            )
        except SearchTooBroad as exc:  # the reset said so; live events follow
            log_event(
                Event.SEARCH_TOO_BROAD, level="warning", op="events.reset", error=str(exc)[:300]
            )
            return []
