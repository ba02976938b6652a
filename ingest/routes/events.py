"""Live job events as server-sent events: one job's story, or every matching change.

Both streams are `text/event-stream`: `event: job` with the job as JSON, `event: reset`
when the client's history was lost (or its `Last-Event-ID` is none this deployment issued:
the stream then starts afresh); every event's `id:` resumes the stream right after
it (send it back as `Last-Event-ID`, on this API process or another, after a restart or a
failover too, as long as the oplog still holds that point). Heartbeats (comment lines)
keep proxies from closing idle streams. An event's job comes without its `payload` and
`result` unless `?include=` asks for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query
from fastapi.responses import Response
from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

from brook.common.domain.status import JobStatus
from brook.ingest.deps import State
from brook.ingest.errors import RETRY_AFTER_S
from brook.ingest.eventids import EventId, InvalidEventId
from brook.ingest.feeds import SEP, Feed, FeedOptions
from brook.ingest.fields import INCLUDE_PATTERN, parse_include
from brook.ingest.live import EventFilter, Hub

READY_WAIT_S = 5.0
SEND_TIMEOUT_S = 30.0  # a client that takes no bytes for this long is cut off

router = APIRouter(tags=["events"])

LastEventId = Annotated[
    str | None,
    Header(
        max_length=1024,
        description="The `id:` of the last event received: the stream resumes right after it.",
    ),
]

Include = Annotated[
    str | None,
    Query(
        max_length=100,
        json_schema_extra={"pattern": INCLUDE_PATTERN},
        description="`payload`, `result` or both (comma-separated): read per job and added "
        "to each event's job, which leaves them out otherwise.",
    ),
]

# One event of the stream (id-only lines, which move Last-Event-ID on, carry no event).
_EVENT_SCHEMA = {
    "title": "ServerSentEvent",
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": ["job", "reset"]},
        "data": {
            "type": "string",
            "description": "`job`: the job (without `payload` and `result` unless asked for "
            "by `include`). `reset`: `{reason, since}`, then the current state (`reason` "
            "`unknown_id`, `since` null: a `Last-Event-ID` none of this deployment's).",
            "contentMediaType": "application/json",
            "contentSchema": {"type": "object"},
        },
        "id": {
            "type": "string",
            "description": "Opaque; send it back as `Last-Event-ID` to resume right after it.",
        },
    },
}

_STREAM = {
    "description": "A `text/event-stream` of `job` events (and `reset`, after lost history or an "
    "unknown `Last-Event-ID`).",
    "content": {"text/event-stream": {"schema": _EVENT_SCHEMA}},
}


@dataclass(frozen=True)
class _Resume:
    since: EventId | None = None
    unreadable: str | None = None  # why the client's id names nothing to resume from


async def _since(state: State, last_event_id: str | None) -> _Resume:
    """The position a `Last-Event-ID` names. An id this deployment did not issue (its MAC
    is checked before anything else is done with it) resumes nothing: the stream starts
    afresh after a `reset` that says why. Empty: none."""
    if last_event_id is None or not last_event_id.strip():
        return _Resume()
    ids = await state.ids.get()
    try:
        return _Resume(since=ids.decode(last_event_id))
    except InvalidEventId as exc:
        return _Resume(unreadable=str(exc))


def _busy(what: str) -> HTTPException:
    return HTTPException(503, f"{what}; retry shortly", headers={"Retry-After": RETRY_AFTER_S})


async def _ready(hub: Hub) -> None:
    try:
        async with asyncio.timeout(READY_WAIT_S):
            await hub.ready.wait()
    except TimeoutError:
        raise _busy("the event stream is not open yet (no primary?)") from None


class _Stream(EventSourceResponse):
    """An event stream that gives its slot back however it ends (a client gone before the
    first byte included: this runs once the response is handed to the server)."""

    def __init__(self, *args: Any, on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _respond(
    state: State, flt: EventFilter, options: FeedOptions, resume: _Resume
) -> Response:
    """A stream, within this process's caps: `503` beyond `BROOK_SSE_MAX_CLIENTS` streams,
    or when a resume needs a catch-up and `BROOK_SSE_MAX_CATCH_UPS` are running."""
    hub = state.hub
    since = resume.since
    ids = await state.ids.get()  # before the slot is taken: nothing may fail in between
    if since is not None and not hub.replays(since.at) and state.catch_ups.full:
        raise _busy("too many clients are catching up")
    if not state.streams.take():
        raise _busy("too many event streams are open")
    feed = Feed(hub, state.store, flt, options, ids, state.catch_ups)
    return _Stream(
        feed.events(since.at if since is not None else None, unreadable=resume.unreadable),
        ping=state.settings.sse_ping_seconds,
        send_timeout=SEND_TIMEOUT_S,
        sep=SEP,  # the pings' line ends too
        on_close=state.streams.give,
    )


@router.get(
    "/jobs/{job_id}/events",
    response_class=EventSourceResponse,
    responses={
        200: _STREAM,
        204: {"description": "The stream already ended at `Last-Event-ID` (a terminal state)."},
    },
)
async def job_events(
    job_id: str, state: State, last_event_id: LastEventId = None, include: Include = None
) -> Response:
    """One job's events: its current state first (unless resuming), then one event per
    change (status, attempt, progress, result or error); the stream ends after a terminal
    state."""
    fields = parse_include(include)
    resume = await _since(state, last_event_id)
    if resume.since is not None and resume.since.final:
        return Response(status_code=204)
    if await state.store.job_doc(job_id, {"_id": 1}) is None:
        raise HTTPException(404, f"no job {job_id}")
    await _ready(state.hub)
    options = FeedOptions(
        per_job=True, idle_s=state.settings.sse_ping_seconds, include=fields
    )
    return await _respond(state, EventFilter(job_id=job_id), options, resume)


@router.get("/events", response_class=EventSourceResponse, responses={200: _STREAM})
async def events(
    state: State,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    task: Annotated[str | None, Query(max_length=200)] = None,
    status: JobStatus | None = None,
    last_event_id: LastEventId = None,
    include: Include = None,
) -> Response:
    """Every change of every matching job (by queue, task and the status it changed to),
    for as long as the client stays."""
    fields = parse_include(include)
    resume = await _since(state, last_event_id)
    await _ready(state.hub)
    flt = EventFilter(queue=queue, task=task, status=status.value if status else None)
    options = FeedOptions(
        per_job=False, idle_s=state.settings.sse_ping_seconds, include=fields
    )
    return await _respond(state, flt, options, resume)
