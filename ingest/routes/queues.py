"""The queues: what each holds, by status, and its cluster-wide limits."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse

from brook.common.domain.errors import InvalidInput
from brook.common.domain.models import QUEUE_NAME
from brook.common.domain.queues import QueueUpdate
from brook.ingest.deps import Core, json_body
from brook.ingest.encoding import json_response

router = APIRouter(tags=["queues"])

# Any name reaches the validator, so a bad one gets the same `422` as from the client.
# The document states the pattern the validator holds names to.
Name = Annotated[
    str,
    Path(description="the queue's name", max_length=200, json_schema_extra={"pattern": QUEUE_NAME}),
]
# The body is read by hand (size limit first) and checked by the validator the Python
# client shares; its schema is declared here so the OpenAPI document still shows it.
_SET_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": QueueUpdate.model_json_schema()}},
    }
}


@router.get("/queues")
async def list_queues(core: Core) -> JSONResponse:
    """Every queue that holds jobs or has limits, by name: `{"name", "counts": {status: n},
    "concurrency", "rate", "paused", "slots_in_use", "starts_in_window"}`. The counts come
    from one aggregation; `slots_in_use` is the number of jobs holding one of the queue's
    slots now (null for a queue without limits), checked against the jobs themselves."""
    return json_response({"queues": [q.to_api() for q in await core.queues()]})


@router.put(
    "/queues/{name}",
    openapi_extra=_SET_OPENAPI,
    responses={
        413: {"description": "body over the limit"},
        422: {"description": "a bad name or body; nothing changed"},
    },
)
async def set_queue(
    name: Name, body: Annotated[object, Depends(json_body)], core: Core
) -> JSONResponse:
    """Set the queue's limits for the whole cluster: `concurrency` (running jobs at most),
    `rate` (`{"limit": n, "per_seconds": s}`: starts in any window of that length at most),
    `paused` (nothing new starts; running jobs finish). `null` clears a limit; a field left
    out keeps its value. Answers the queue as `GET /queues` shows it; `422` (nothing
    changed) for a bad name or body."""
    if not isinstance(body, dict):  # `None` would read as "no change" in the client's call
        raise InvalidInput("the body must be a JSON object")
    queue = await core.set_queue(name, body)
    return json_response(queue.to_api())
