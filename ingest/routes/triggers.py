"""Triggers: list them, pause and resume them (cluster-wide, held in MongoDB).

The API reads the `brook_triggers` documents the dispatchers write when they start and as
they follow: per trigger its follower, lag, jobs made, changes skipped, paused, and lost
history.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path
from fastapi.responses import JSONResponse

from brook.common.domain.errors import TriggerNotFound
from brook.common.runtime.log_events import Event, log_event, requested_by
from brook.common.store.triggers import TriggerStore
from brook.ingest.deps import State
from brook.ingest.encoding import json_response

router = APIRouter(tags=["triggers"])


async def get_triggers(state: State) -> TriggerStore:
    return TriggerStore(state.store.db)


Triggers = Annotated[TriggerStore, Depends(get_triggers)]
Name = Annotated[str, Path(max_length=100)]


@router.get("/triggers")
async def list_triggers(triggers: Triggers, state: State) -> JSONResponse:
    """Every trigger a dispatcher has declared: its follower (null while none holds its
    lease), `lag_s` (the server's time now minus the cluster time up to which every change
    has its job), `jobs_made`, `skipped` (changes that could not become a job) with
    `last_skipped` (`change_id`, `operation`, `document_id`, `reason`, `at`), `paused`, and
    `history_lost` (how many times its token had left the oplog) with `history_lost_at`."""
    now = await state.store.clock.read()
    return json_response({"triggers": [t.to_api(now) for t in await triggers.list_all()]})


async def _set_paused(
    state: State, triggers: TriggerStore, name: str, paused: bool
) -> JSONResponse:
    try:
        trigger = await triggers.set_paused(name, paused)
    except TriggerNotFound:
        raise HTTPException(404, f"no trigger {name!r}") from None
    event = Event.TRIGGER_PAUSED if paused else Event.TRIGGER_RESUMED
    log_event(event, trigger=name, by=requested_by.get())
    return json_response(trigger.to_api(await state.store.clock.read()))


@router.post("/triggers/{name}/pause")
async def pause(name: Name, triggers: Triggers, state: State) -> JSONResponse:
    """No job is made from this trigger's changes until it is resumed; its token is kept."""
    return await _set_paused(state, triggers, name, True)


@router.post("/triggers/{name}/resume")
async def resume(name: Name, triggers: Triggers, state: State) -> JSONResponse:
    """Jobs are made again, first for the changes made while it was paused (those the oplog
    still holds)."""
    return await _set_paused(state, triggers, name, False)
