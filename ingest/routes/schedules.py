"""Cron schedules: list them, pause and resume them (cluster-wide, held in MongoDB).

The API reads the `brook_schedules` documents the dispatchers write when they start, not
the task modules: it lists what the cluster runs, whatever this process's `BROOK_TASKS`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path
from fastapi.responses import JSONResponse

from brook.common.domain.errors import ScheduleNotFound
from brook.common.runtime.log_events import Event, log_event, requested_by
from brook.common.store.schedules import ScheduleStore
from brook.ingest.deps import State
from brook.ingest.encoding import json_response

router = APIRouter(tags=["schedules"])


async def get_schedules(state: State) -> ScheduleStore:
    return ScheduleStore(state.store.db)


Schedules = Annotated[ScheduleStore, Depends(get_schedules)]
Name = Annotated[str, Path(max_length=100)]


@router.get("/schedules")
async def list_schedules(schedules: Schedules) -> JSONResponse:
    """Every schedule a dispatcher has declared, with its next run and last job."""
    now = datetime.now(UTC)
    return json_response({"schedules": [s.to_api(now) for s in await schedules.list_all()]})


async def _set_paused(schedules: ScheduleStore, name: str, paused: bool) -> JSONResponse:
    try:
        state = await schedules.set_paused(name, paused)
    except ScheduleNotFound:
        raise HTTPException(404, f"no schedule {name!r}") from None
    event = Event.SCHEDULE_PAUSED if paused else Event.SCHEDULE_RESUMED
    log_event(event, schedule=name, by=requested_by.get())
    return json_response(state.to_api(datetime.now(UTC)))


@router.post("/schedules/{name}/pause")
async def pause(name: Name, schedules: Schedules) -> JSONResponse:
    """No tick of this schedule is submitted until it is resumed, by any dispatcher."""
    return await _set_paused(schedules, name, True)


@router.post("/schedules/{name}/resume")
async def resume(name: Name, schedules: Schedules) -> JSONResponse:
    """Ticks are submitted again from the next one; those skipped while paused never run."""
    return await _set_paused(schedules, name, False)
