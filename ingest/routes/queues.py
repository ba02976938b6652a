"""The queues: what each holds, by status."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ingest.deps import Core
from ingest.encoding import json_response

router = APIRouter(tags=["queues"])


@router.get("/queues")
async def list_queues(core: Core) -> JSONResponse:
    """Every queue that holds jobs, by name: `{"name", "counts": {status: n}, "concurrency",
    "rate", "paused"}`. The counts come from one aggregation. `concurrency`, `rate` and
    `paused` are set by `PUT /queues/{name}` (cluster-wide limits, the next issue); until
    then they are `null`, `null` and `false`."""
    return json_response({"queues": [q.to_api() for q in await core.queues()]})
