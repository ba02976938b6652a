"""The queues: what each holds, by status, and its cluster-wide limits."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from common.queues import QueueUpdate
from common.settings import QUEUE_NAME
from ingest.deps import Core
from ingest.encoding import json_response

router = APIRouter(tags=["queues"])

Name = Annotated[str, Path(pattern=QUEUE_NAME, description="the queue's name")]


@router.get("/queues")
async def list_queues(core: Core) -> JSONResponse:
    """Every queue that holds jobs or has limits, by name: `{"name", "counts": {status: n},
    "concurrency", "rate", "paused", "slots_in_use", "starts_in_window"}`. The counts come
    from one aggregation; `slots_in_use` is the number of jobs holding one of the queue's
    slots now (null for a queue without limits), checked against the jobs themselves."""
    return json_response({"queues": [q.to_api() for q in await core.queues()]})


@router.put("/queues/{name}")
async def set_queue(name: Name, update: QueueUpdate, core: Core) -> JSONResponse:
    """Set the queue's limits for the whole cluster: `concurrency` (running jobs at most),
    `rate` (`{"limit": n, "per_seconds": s}`: starts in any window of that length at most),
    `paused` (nothing new starts; running jobs finish). `null` clears a limit; a field left
    out keeps its value. Answers the queue as `GET /queues` shows it; `422` (nothing
    changed) for a bad name or body."""
    queue = await core.set_queue(name, update.model_dump(exclude_unset=True))
    return json_response(queue.to_api())
