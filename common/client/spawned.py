"""A cancel that reaches spawned jobs: the jobs a task submitted with `ctx.submit` (not
`detach=True`), and theirs in turn, down the tree.

Who propagates: the client core that cancelled a job (`POST /jobs/{id}/cancel`, the bulk
cancel, `Client.cancel`), and every dispatcher's sweep. The cancelled job is marked
`spawn_cancel` before the first of its spawned jobs is touched, and a running spawned job
asked to stop is marked in the same write: a propagation cut short (its process died, or
no primary answered), or a task that spawned again before it was stopped, leaves an ended
job still marked, and the sweep goes down from it again. Every change is one conditional
write (waiting or pending → cancelled; running → asked to stop), so two propagations
through the same tree change each job once, logged by the one whose write changed it.
Finished jobs are walked through (theirs may still run), not changed.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Sequence
from typing import Any, Literal

import structlog

from brook.common.client.dependents import settle
from brook.common.domain.errors import JobConflict
from brook.common.domain.models import Doc, Job
from brook.common.domain.status import JobStatus
from brook.common.runtime.log_events import Event, job_fields, log_event, requested_by
from brook.common.store.jobs import JobStore

Via = Literal["cancel", "bulk", "sweep", "schedule"]

# How many jobs one read or write of a propagation names (a wider level takes more).
PAGE = 1000

_OPEN = {JobStatus.WAITING.value, JobStatus.PENDING.value}


def _unfinished(doc: Doc) -> bool:
    """A spawned job a cancel changes: waiting or pending, or running and not yet asked."""
    status = doc.get("status")
    running = status == JobStatus.RUNNING.value
    return status in _OPEN or (running and not doc.get("cancel_requested"))


async def cancel_spawned(
    store: JobStore, roots: Collection[str], *, via: Via, dry_run: bool = False
) -> int:
    """Cancel every unfinished job these jobs spawned, and theirs, down the tree
    (`ParentCancelled`), then take the `spawn_cancel` mark off the roots that have ended.
    Returns how many it cancelled or asked to stop (with `dry_run`: would, changing
    nothing)."""
    seen = set(roots)
    frontier = list(dict.fromkeys(roots))
    count = 0
    while frontier:
        children: list[Doc] = []
        for page in _pages(frontier):
            children += [c for c in await store.spawned_children(page) if c["_id"] not in seen]
        seen.update(str(c["_id"]) for c in children)
        to_cancel = [str(c["_id"]) for c in children if _unfinished(c)]
        if dry_run:
            count += len(to_cancel)
        else:
            for page in _pages(to_cancel):
                count += await _cancel(store, page, via)
        frontier = [str(c["_id"]) for c in children]
    if not dry_run:
        await store.spawn_cancel_done(list(roots))
    return count


async def cancel_with_spawned(store: JobStore, job_id: str, *, via: Via) -> tuple[Job | None, int]:
    """Cancel one job and every unfinished job it spawned, down the tree: the job as the
    cancel left it (None if it had finished already: it stays as it was), and how many
    spawned jobs were cancelled or asked to stop. A waiting or pending job is cancelled at
    once (its dependents settled), a running one asked to stop. `JobNotFound` for no job."""
    # Marked first: a propagation cut short is finished by a dispatcher's sweep.
    await store.mark_spawn_cancel([job_id])
    try:
        job: Job | None = await store.cancel(job_id)
    except JobConflict:
        job = None  # finished: what it spawned may still run
    if job is not None:
        cancelled = job.status == JobStatus.CANCELLED
        if structlog.is_configured():
            event = Event.JOB_CANCELLED if cancelled else Event.JOB_CANCEL_REQUESTED
            log_event(event, **job_fields(job), by=requested_by.get(), **_via(via))
        if cancelled and job.has_dependents:
            await settle(store, [job.id], via="cancel")
    return job, await cancel_spawned(store, [job_id], via=via)


def _via(via: Via) -> dict[str, str]:
    # A caller's own cancel says nothing more (as before spawned jobs); others name theirs.
    return {} if via == "cancel" else {"via": via}


async def sweep_spawned(store: JobStore) -> int:
    """A dispatcher's sweep: go down again from every ended job still marked `spawn_cancel`
    (a propagation cut short, or a job stopped after the pass); how many such jobs."""
    roots = await store.spawn_cancels_left()
    if roots:
        await cancel_spawned(store, roots, via="sweep")
    return len(roots)


async def _cancel(store: JobStore, ids: Sequence[str], via: Via) -> int:
    done = await store.cancel_spawned(ids, secrets.token_hex(8))
    for doc in done:
        _log(doc, via)
    parents = [
        str(d["_id"])
        for d in done
        if d.get("has_dependents") and d.get("status") == JobStatus.CANCELLED.value
    ]
    if parents:
        await settle(store, parents, via="cancel")
    return len(done)


def _pages(ids: Sequence[str]) -> list[Sequence[str]]:
    return [ids[i : i + PAGE] for i in range(0, len(ids), PAGE)]


def _log(doc: Doc, via: Via) -> None:
    # Brook's own processes configure logging; a program using the client logs Brook's
    # events only if it configured structlog itself.
    if not structlog.is_configured():
        return
    stopping = doc.get("status") == JobStatus.RUNNING.value
    fields: dict[str, Any] = {
        "job_id": str(doc["_id"]),
        "attempt": int(doc.get("attempts", 0)),
        "task": doc.get("task"),
        "spawned_by": doc.get("spawned_by"),
        "error_type": "ParentCancelled",
        "via": via,
        "by": requested_by.get(),
    }
    log_event(Event.JOB_CANCEL_REQUESTED if stopping else Event.JOB_CANCELLED, **fields)
