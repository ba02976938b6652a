"""Live job events: one change stream per API process, fanned out in memory.

`Hub.run()` follows one change stream on the jobs collection. While a client listens (and
for `LINGER_S` after the last one left) the stream carries every change with its
post-image, so that each event carries the job exactly as that change left it (not as a
later lookup finds it). While nobody listens it is lean: only the changes the throughput
figures count (a start, an end), cut down on the server to the few fields they need, and
read at most once a `LEAN_PACE_S` (one batch per read), so an API process that nobody
watches costs next to nothing per job. Switching reopens the
stream at the hub's position: nothing is missed or seen twice. Every event is encoded once
(its JSON text is shared by every client) and kept in a ring of the latest ones, bounded in
events (`RING_SIZE`) and in bytes (`BROOK_LIVE_RING_BYTES`: the oldest go first); each
client's `Subscription` gets the events its filter matches through a bounded queue. A
client that falls `BROOK_SSE_BUFFER` events behind is dropped (it reconnects with its
Last-Event-ID and resumes), so a slow client never slows the others, and memory stays
bounded however many clients there are. An event carries the job without its payload and
result (cut on the server, `EVENT_LEFT_OUT`): a client asks for them (`?include=`), and its
feed reads them per job.

Resuming: an event's position is the change stream's resume token. A position still in
the ring is replayed from memory. An older one (say, from before this process started) is
read by a short-lived catch-up stream of the client's own, from its position up to the
hub's position at the moment it subscribed, while live events queue behind; then the
client goes live. So idle clients cost no cursor, and a catch-up cursor lives only as long
as the catch-up. Positions are ordered by the token's `_data`: a KeyString in hex, whose
byte order is the oplog's order.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.errors import OperationFailure, PyMongoError

from brook.common.domain.models import DEFAULT_QUEUE, Doc, Job
from brook.common.runtime.backoff import Backoff
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.metrics import STREAM_HISTORY_LOST, STREAM_RESUMES
from brook.common.store.db import is_history_lost, is_transient
from brook.common.store.jobs import JobStore, buffered
from brook.common.store.pipelines import (
    EVENT_LEFT_OUT,
    EVENT_PROJECTION,
    INVALIDATING,
    LEAN_PIPELINE,
    LIVE_PIPELINE,
    TERMINAL_VALUES,
    catch_up_pipeline,
)
from brook.ingest.encoding import job_text
from brook.ingest.metrics import SSE_DROPPED

STREAM = "live"  # the `stream` label of this process's change stream in logs and metrics
RING_SIZE = 2_000  # events kept for resuming from memory (older: a catch-up stream)
RING_BYTES = 64 * 1024 * 1024  # and their bytes at most (`BROOK_LIVE_RING_BYTES`)
# What an event holds besides its text (its position, ids, the ring's slot), counted
# generously: a ring of small events is bounded by the count, not by this.
EVENT_OVERHEAD = 1024
CATCH_UP_AWAIT_MS = 200
LINGER_S = 60.0  # whole events flow on this long after the last client left
LEAN_AWAIT_MS = 100  # an idle lean stream notices a new client within about this
# A lean stream asks the server for more at most this often: the figures it feeds are
# counted in 10 s buckets by each change's own time, so a second late costs them nothing,
# while a read per start or end cost a busy set 10-20% of its drain rate (a wake-up and a
# round trip per change). A client arriving cuts the wait short.
LEAN_PACE_S = 1.0


@dataclass(frozen=True, kw_only=True)
class Tally:
    """What the throughput figures count of one change: a start (and its wait, from due to
    start on the server's clock), an end (the terminal status), or both in one write."""

    wall_ms: int
    started: bool
    wait_ms: float | None
    ended: str | None


def tally(change: Mapping[str, Any]) -> Tally | None:
    """The start and/or end one change made, from the fields it set; None for any other."""
    if change.get("operationType") != "update":
        return None
    fields = (change.get("updateDescription") or {}).get("updatedFields") or {}
    started_at, status = fields.get("started_at"), fields.get("status")
    started = isinstance(started_at, datetime)
    ended = status if status in TERMINAL_VALUES else None
    if not started and ended is None:
        return None
    wait_ms = None
    run_at = (change.get("fullDocument") or {}).get("run_at")
    if isinstance(started_at, datetime) and isinstance(run_at, datetime):
        wait_ms = max((started_at - run_at).total_seconds() * 1000, 0.0)
    wall = change.get("wallTime")
    ms = wall_ms(wall) if isinstance(wall, datetime) else int(time.time() * 1000)
    return Tally(wall_ms=ms, started=started, wait_ms=wait_ms, ended=ended)


@dataclass(frozen=True, kw_only=True)
class Position:
    """A point in the change stream: its resume token, and the server's wall time there
    (this host's clock for a position between events), used only after history was lost."""

    token: Mapping[str, Any]
    wall_ms: int

    @property
    def key(self) -> str:
        return str(self.token["_data"])


@dataclass(frozen=True, kw_only=True)
class LiveEvent:
    at: Position
    job_id: str
    task: str
    queue: str
    status: str
    data: str  # the job as JSON text (without `EVENT_LEFT_OUT`), encoded once for every client

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_VALUES

    @property
    def size(self) -> int:
        """What the ring counts of it, in bytes: its text as Python holds it, and the rest."""
        return sys.getsizeof(self.data) + EVENT_OVERHEAD


@dataclass(frozen=True, kw_only=True)
class Reset:
    """The client's position is no longer in the oplog: its history between `since_ms` and
    now is lost, and it is told so."""

    reason: str
    since_ms: int


@dataclass(frozen=True, kw_only=True)
class EventFilter:
    job_id: str | None = None
    queue: str | None = None
    task: str | None = None
    status: str | None = None

    def matches(self, event: LiveEvent) -> bool:
        return (
            (self.job_id is None or event.job_id == self.job_id)
            and (self.queue is None or event.queue == self.queue)
            and (self.task is None or event.task == self.task)
            and (self.status is None or event.status == self.status)
        )


class Closed(Exception):
    """The hub let go of this client (it fell too far behind, or the hub restarted); the
    client resumes from its last event id."""


def wall_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


# The top-level fields an event's job leaves out (a step's result is never shown anyway).
LEFT_OUT = frozenset(name for name in EVENT_LEFT_OUT if "." not in name)


def live_event(at: Position, doc: Doc) -> LiveEvent:
    """The event of a job document (read with `EVENT_PROJECTION`, or cut by the stream)."""
    job = Job.from_doc(doc)
    return LiveEvent(
        at=at,
        job_id=job.id,
        task=job.task,
        queue=job.queue or DEFAULT_QUEUE,
        status=job.status.value,
        data=job_text(job, leave_out=LEFT_OUT),
    )


async def build_event(store: JobStore, change: Mapping[str, Any]) -> LiveEvent | None:
    """The event for one change; a change without a post-image (images not enabled yet, or
    expired) carries the job as it is now. None for a job deleted since, or not a job."""
    doc = change.get("fullDocument")
    if doc is None:
        doc = await store.job_doc(str(change["documentKey"]["_id"]), EVENT_PROJECTION)
        if doc is None:
            return None
    wall = change.get("wallTime")
    ms = wall_ms(wall) if isinstance(wall, datetime) else int(time.time() * 1000)
    try:
        return live_event(Position(token=change["_id"], wall_ms=ms), doc)
    except (KeyError, ValueError, TypeError) as exc:
        log_event(Event.STREAM_ERROR, level="warning", stream=STREAM, error=f"not a job: {exc!r}")
        return None


@dataclass(eq=False)
class Subscription:
    """One client's view of the hub: a filter, and a bounded queue of matching events."""

    filter: EventFilter
    start: Position  # the hub's position when it subscribed: later events are queued
    limit: int
    after_key: str | None = None  # skip events at or before this (the client is ahead)
    replay: list[LiveEvent] | None = None  # None: events before `start` need a catch-up
    closed: str | None = None  # why the hub let go of it
    _queue: deque[LiveEvent] = field(default_factory=deque)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def offer(self, event: LiveEvent) -> bool:
        """Queue an event; False (and dropped) when the client is `limit` events behind."""
        if len(self._queue) >= self.limit:
            self.close(f"this client fell {self.limit} events behind")
            return False
        self._queue.append(event)
        self._wake.set()
        return True

    def close(self, reason: str) -> None:
        """Stop this client: it ends once it has what is already queued."""
        self.closed = reason
        self._wake.set()

    def backlog(self) -> int:
        return len(self._queue)

    async def next(self, timeout: float) -> LiveEvent | None:
        """The next event, or None after `timeout` seconds without one."""
        while not self._queue:
            if self.closed is not None:
                raise Closed(self.closed)
            self._wake.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                return None
        return self._queue.popleft()


AHEAD_S = 60  # how far ahead of us another API process's position may plausibly be


def cluster_seconds(key: str) -> int | None:
    """The cluster time (seconds) a token's `_data` starts with: a KeyString timestamp
    (type byte 0x82, then 4 bytes of seconds and 4 of increment), or None if it is not one."""
    if len(key) < 18 or key[:2] != "82":
        return None
    try:
        return int(key[2:10], 16)
    except ValueError:
        return None


def cluster_time(key: str) -> tuple[int, int] | None:
    """The cluster time (seconds, increment) a token's `_data` starts with, or None."""
    seconds = cluster_seconds(key)
    if seconds is None or len(key) < 18:
        return None
    try:
        return seconds, int(key[10:18], 16)
    except ValueError:
        return None


def _close_ahead(since: Position, position: Position) -> bool:
    """A position ahead of ours is another API process's (its stream is a little further
    on): plausible only if it is a real token and not far in the future. Anything else is
    left to the server to judge, by a catch-up stream."""
    theirs, ours = cluster_seconds(since.key), cluster_seconds(position.key)
    return theirs is not None and ours is not None and theirs - ours <= AHEAD_S


class Hub:
    def __init__(
        self,
        store: JobStore,
        *,
        buffer: int,
        ring_size: int = RING_SIZE,
        ring_bytes: int = RING_BYTES,
        observe: Callable[[Tally], None] | None = None,
        max_await_ms: int = 1000,
        linger_s: float = LINGER_S,
        lean_pace_s: float = LEAN_PACE_S,
    ) -> None:
        self.store = store
        self.buffer = buffer
        self.observe = observe
        self.max_await_ms = max_await_ms
        self.linger_s = linger_s
        self.lean_pace_s = lean_pace_s
        self.position: Position | None = None
        self.ready = asyncio.Event()
        self.ring_size = ring_size
        self.ring_bytes = ring_bytes
        self._ring: deque[LiveEvent] = deque()
        self._ring_used = 0  # the bytes of the events in the ring (`LiveEvent.size`)
        self._floor: Position | None = None  # every event after it, to `position`, is in the ring
        self._by_job: dict[str, set[Subscription]] = {}
        self._others: set[Subscription] = set()
        self._images = False
        self._full = False  # the stream open now carries whole events
        self._idle_since: float | None = float("-inf")  # the last client left; None: one listens
        self._wanted = asyncio.Event()  # a client came while the stream was lean
        self._switching: str | None = None  # reopening for a change of mode, not a failure

    @property
    def lean(self) -> bool:
        """The stream open now carries only what the figures count (nobody listens)."""
        return not self._full

    def count(self) -> int:
        return len(self._others) + sum(len(s) for s in self._by_job.values())

    def ring_used(self) -> tuple[int, int]:
        """The events in the ring, and their bytes as it counts them."""
        return len(self._ring), self._ring_used

    # -- the one change stream ---------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        finally:  # cancelled at shutdown, or a bug: no client waits on a hub that is gone
            self._restart("the hub stopped", why=None)

    async def _run(self) -> None:
        backoff = Backoff(0.1, 5.0)
        while True:
            try:
                await self._follow(backoff)
            except OperationFailure as exc:
                if is_history_lost(exc):
                    self._restart(f"history lost: {exc}")
                    continue
                log_event(Event.STREAM_ERROR, level="warning", stream=STREAM, error=str(exc)[:300])
                await asyncio.sleep(backoff.next())
            except PyMongoError as exc:
                log_event(Event.STREAM_ERROR, level="warning", stream=STREAM, error=str(exc)[:300])
                await asyncio.sleep(backoff.next())

    async def _follow(self, backoff: Backoff) -> None:
        if not self._images:
            await self._enable_post_images()
        full, switching = self._wants_full(), self._switching
        # The mode is set before the stream opens: a client that comes meanwhile to a lean
        # one flags it, and it is reopened whole at once.
        self._full = full
        self._wanted.clear()
        self._switching = None
        if not full:  # nothing to replay from memory: an older position gets a catch-up
            self._clear_ring()
        token = self.position.token if self.position is not None else None
        async with await self.store.changes(
            LIVE_PIPELINE if full else LEAN_PIPELINE,
            resume_after=token,
            max_await_ms=self.max_await_ms if full else LEAN_AWAIT_MS,
            full_document="whenAvailable",
        ) as stream:
            if token is None:
                log_event(Event.STREAM_OPENED, stream=STREAM)
            elif switching is None:
                STREAM_RESUMES.labels(stream=STREAM).inc()
                log_event(Event.STREAM_RESUMED, stream=STREAM)
            backoff.reset()
            # A lean stream moves past changes a client wants: once one came, it moves no
            # further, and the whole stream resumes from here (the change in hand too).
            if self.position is not None and self._widen(full):
                return
            self._advance(stream.resume_token)
            self.ready.set()
            while stream.alive:
                if full and not self._wants_full():
                    self._switching = "lean"
                    return
                change = await self._next(stream, full)
                if self._widen(full):
                    return
                if change is not None and change["operationType"] in INVALIDATING:
                    self._restart(
                        f"the jobs collection saw {change['operationType']}",
                        why=Event.STREAM_INVALIDATED,
                    )
                    return
                if change is not None:
                    await self._take(change, full)
                self._advance(stream.resume_token)

    async def _take(self, change: Mapping[str, Any], full: bool) -> None:
        if self.observe is not None and (counted := tally(change)) is not None:
            self.observe(counted)
        if full and (event := await build_event(self.store, change)):
            self._publish(event)

    async def _next(self, stream: AsyncChangeStream[Doc], full: bool) -> Mapping[str, Any] | None:
        """The stream's next change, or None. Before asking the server for more, a lean
        stream waits `lean_pace_s` (or until a client comes: it then returns None). Should
        PyMongo ever stop telling what its batch holds, it reads as a whole stream does."""
        if not full and buffered(stream) == 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wanted.wait(), self.lean_pace_s)
            if self._wanted.is_set():
                return None
        return await stream.try_next()

    def _widen(self, full: bool) -> bool:
        """A client came while the stream is lean: reopen it whole."""
        if full or not self._wanted.is_set():
            return False
        self._switching = "full"
        return True

    def _wants_full(self) -> bool:
        return self._idle_since is None or time.monotonic() - self._idle_since < self.linger_s

    async def _enable_post_images(self) -> None:
        """Without post-images (no privilege for `collMod`, say) events still flow: each
        carries the job as a lookup finds it, which may be later than the change's own."""
        try:
            await self.store.enable_post_images()
        except OperationFailure as exc:
            if is_transient(exc):
                raise
            log_event(Event.MONGO_REFUSED, level="warning", op="enable_post_images", error=str(exc))
        self._images = True

    def _advance(self, token: Mapping[str, Any] | None) -> None:
        if token is None:
            return
        if self.position is None or str(token["_data"]) > self.position.key:
            self.position = Position(token=token, wall_ms=int(time.time() * 1000))
        if self._floor is None:
            self._floor = self.position

    def _publish(self, event: LiveEvent) -> None:
        self._ring.append(event)
        self._ring_used += event.size
        # The oldest go first, the newest too when it alone is over the budget: a client
        # resuming from before `_floor` gets a catch-up stream instead.
        while self._ring and (
            len(self._ring) > self.ring_size or self._ring_used > self.ring_bytes
        ):
            old = self._ring.popleft()
            self._ring_used -= old.size
            self._floor = old.at
        self.position = event.at
        behind: list[Subscription] = []
        for sub in (*self._by_job.get(event.job_id, ()), *self._others):
            if not sub.filter.matches(event):
                continue
            if sub.after_key is not None and event.at.key <= sub.after_key:
                continue
            if not sub.offer(event):
                behind.append(sub)
        for sub in behind:
            self.unsubscribe(sub)
            SSE_DROPPED.inc()
            log_event(
                Event.SSE_CLIENT_DROPPED, level="warning", reason=sub.closed, **asdict(sub.filter)
            )

    def _restart(self, reason: str, *, why: Event | None = Event.STREAM_HISTORY_LOST) -> None:
        """The stream cannot go on from its position: start afresh, and drop every client
        (each resumes from its own Last-Event-ID, and is told what it lost)."""
        if why is Event.STREAM_HISTORY_LOST:
            STREAM_HISTORY_LOST.labels(stream=STREAM).inc()
        if why is not None:
            log_event(why, level="warning", stream=STREAM, reason=reason[:300])
        self.ready.clear()
        self._images = False  # a dropped collection comes back without them
        self.position = None
        self._clear_ring()
        for sub in [*self._others, *(s for subs in self._by_job.values() for s in subs)]:
            sub.close(reason)
        self._others.clear()
        self._by_job.clear()
        if self._idle_since is None:
            self._idle_since = time.monotonic()

    def _clear_ring(self) -> None:
        self._ring.clear()
        self._ring_used = 0
        self._floor = None

    # -- clients -----------------------------------------------------------------------------

    def replays(self, since: Position) -> bool:
        """Whether a client resuming from `since` would be served from memory, with no
        catch-up stream of its own (as `subscribe` decides it now)."""
        if self.position is None:
            return False
        if since.key >= self.position.key:
            return _close_ahead(since, self.position)
        return self._floor is not None and since.key >= self._floor.key

    def subscribe(self, flt: EventFilter, since: Position | None = None) -> Subscription:
        """Register a client now (call only once `ready`); events after the hub's current
        position are queued for it. With `since`, also say how to get those before."""
        assert self.position is not None, "subscribe only once the hub is ready"
        sub = Subscription(filter=flt, start=self.position, limit=self.buffer)
        if since is not None:
            if since.key >= self.position.key:
                if _close_ahead(since, self.position):
                    sub.after_key = since.key  # nothing to replay: it is at or ahead of us
                    sub.replay = []
            elif self._floor is not None and since.key >= self._floor.key:
                sub.replay = [e for e in self._ring if e.at.key > since.key and flt.matches(e)]
        if flt.job_id is not None:
            self._by_job.setdefault(flt.job_id, set()).add(sub)
        else:
            self._others.add(sub)
        self._idle_since = None
        if not self._full:
            self._wanted.set()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._others.discard(sub)
        if sub.filter.job_id is not None:
            subs = self._by_job.get(sub.filter.job_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._by_job[sub.filter.job_id]
        if self._idle_since is None and not self._others and not self._by_job:
            self._idle_since = time.monotonic()


async def catch_up(
    store: JobStore, sub: Subscription, since: Position
) -> AsyncIterator[LiveEvent | Reset]:
    """The events after `since` up to `sub.start`, from a change stream of this client's own
    that ends with the catch-up; a `Reset` if the oplog no longer reaches back to `since`."""
    pipeline = catch_up_pipeline(sub.filter.job_id)
    end = sub.start.key
    try:
        async with await store.changes(
            pipeline,
            resume_after=since.token,
            max_await_ms=CATCH_UP_AWAIT_MS,
            full_document="whenAvailable",
        ) as stream:
            while stream.alive:
                change = await stream.try_next()
                if change is not None:
                    if str(change["_id"]["_data"]) > end:
                        return
                    if change["operationType"] in INVALIDATING:
                        raise _Unreachable(f"the jobs collection saw {change['operationType']}")
                    event = await build_event(store, change)
                    if event is not None and sub.filter.matches(event):
                        yield event
                    continue
                token = stream.resume_token
                if token is not None and str(token["_data"]) >= end:
                    return
    except OperationFailure as exc:
        # A position the server cannot resume from (fell off the oplog, or not a token of
        # this deployment at all; the server names that many ways): the history since is
        # lost to this client. A passing failure (an election) is not: the client retries.
        if is_transient(exc):
            raise
        yield Reset(reason=f"history lost: {str(exc)[:200]}", since_ms=since.wall_ms)
    except _Unreachable as exc:
        yield Reset(reason=str(exc), since_ms=since.wall_ms)


class _Unreachable(Exception):
    pass
