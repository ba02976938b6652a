"""A job's output stream (`ctx.emit`): followed as server-sent events, or read at once as
text (`?format=text`)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Header, HTTPException, Query
from fastapi.responses import Response, StreamingResponse
from sse_starlette import EventSourceResponse

from brook.common.domain.output import POSITION_PATTERN, parse_position
from brook.ingest.deps import State
from brook.ingest.feeds import SEP
from brook.ingest.output_feed import OutputFeed, output_text
from brook.ingest.output_hub import OutputReader
from brook.ingest.routes.events import (
    READY_WAIT_S,
    SEND_TIMEOUT_S,
    _busy,
    _Stream,
)

router = APIRouter(tags=["output"])

Position = Annotated[
    str | None,
    Header(
        max_length=30,
        json_schema_extra={"pattern": POSITION_PATTERN},
        description="The `id:` of the last event received (`ATTEMPT-SEQ`): the stream "
        "resumes right after it.",
    ),
]

_EVENT_SCHEMA = {
    "title": "OutputEvent",
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": ["output", "attempt", "end"]},
        "data": {
            "type": "string",
            "description": "`output`: `{attempt, seq, kind, data, step?, emitted_at}` (`kind` "
            "`text` or `json`); `attempt`: `{attempt}`, before that attempt's first chunk; "
            "`end`: `{status}`, the job's terminal status (the stream then closes).",
            "contentMediaType": "application/json",
            "contentSchema": {"type": "object"},
        },
        "id": {
            "type": "string",
            "description": "The position `{attempt}-{seq}`: send it back as `Last-Event-ID` "
            "to resume right after it.",
        },
    },
}


@router.get(
    "/jobs/{job_id}/output",
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "`text/event-stream` of `output`, `attempt` and `end` events; with "
            "`format=text`, the output so far as `text/plain`.",
            "content": {
                "text/event-stream": {"schema": _EVENT_SCHEMA},
                "text/plain": {"schema": {"type": "string"}},
            },
        },
        400: {
            "description": "`Last-Event-ID` is not a position (`ATTEMPT-SEQ`), or is one this "
            "job's output never had."
        },
    },
)
async def job_output(
    job_id: str,
    state: State,
    last_event_id: Position = None,
    attempt: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
    format: Literal["sse", "text"] = "sse",
) -> Response:
    """The job's output, every attempt in turn (or one, with `attempt`): its chunks so far,
    then each one as it is written, then `end` once the job has ended."""
    after = None
    if last_event_id:  # an empty header names no position
        after = parse_position(last_event_id)
        if after is None:
            raise HTTPException(400, "Last-Event-ID is not an output position ('ATTEMPT-SEQ')")
    store = state.output_hub.store
    if await store.status(job_id) is None:
        raise HTTPException(404, f"no job {job_id}")
    if after is not None and not await store.issued(job_id, *after):
        # Well formed, and of a job that exists, but not a position the server issued: a
        # bad request all the same, as a forged id is for live events (docs/security.md).
        raise HTTPException(400, f"this job's output never had position {last_event_id}")
    if format == "text":
        return StreamingResponse(
            output_text(store, job_id, attempt), media_type="text/plain; charset=utf-8"
        )
    return await _follow(state, job_id, attempt, after)


async def _follow(
    state: State, job_id: str, attempt: int | None, after: tuple[int, int] | None
) -> Response:
    hub = state.output_hub
    if not state.streams.take():
        raise _busy("too many event streams are open")
    reader = hub.subscribe(job_id)
    try:
        async with asyncio.timeout(READY_WAIT_S):
            await hub.ready.wait()
    except TimeoutError:
        hub.unsubscribe(reader)
        state.streams.give()
        raise _busy("the output stream is not open yet (no primary?)") from None
    feed = OutputFeed(hub=hub, store=hub.store, reader=reader, attempt=attempt)
    if after is not None:
        feed.last_attempt, feed.last_seq = after
    return _Stream(
        feed.events(),
        ping=state.settings.sse_ping_seconds,
        send_timeout=SEND_TIMEOUT_S,
        sep=SEP,
        on_close=lambda: _closed(state, reader),
    )


def _closed(state: State, reader: OutputReader) -> None:
    """However the stream ends (before its first byte too): its slot and its reader go."""
    state.streams.give()
    state.output_hub.unsubscribe(reader)
