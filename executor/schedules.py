"""Cron schedules, declared in task modules next to their tasks::

    from brook import schedule, task

    @task("report")
    def report(payload): ...

    schedule("report-hourly", "0 * * * *", task="report", tz="Europe/Paris")

Declaring records the schedule and checks it at once (a bad cron, zone, name,
`catch_up` or `overlap` fails the import). Every dispatcher that loads the module runs it; a
dispatcher whose schedules name a task it does not have refuses to start.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brook.common.domain.errors import ConfigError
from brook.common.domain.schedules import Schedule

_SCHEDULES: dict[str, Schedule] = {}


def schedule(
    name: str,
    cron: str,
    *,
    task: str,
    payload: dict[str, Any] | None = None,
    queue: str = "default",
    tz: str = "UTC",
    catch_up: str = "latest",
    overlap: str = "allow",
    start_within_s: float | None = None,
    deadline_s: float | None = None,
) -> Schedule:
    """Run `task` with `payload` at every tick of `cron` (5 fields, or 6 with seconds
    last) in time zone `tz`. After downtime, `catch_up="latest"` runs the most recent
    missed tick once and `"none"` skips the missed ticks. While the previous run is
    unfinished, a tick's `overlap` is `"allow"` (a job anyway), `"skip"` (no job),
    `"buffer_one"` (a job that waits for it, at most one) or `"cancel_other"` (the previous
    run is cancelled, and the new job waits until it has ended). `start_within_s` and
    `deadline_s`: each tick's job's, counted from its submit."""
    declared = Schedule.declare(
        name,
        cron,
        task=task,
        payload=payload,
        queue=queue,
        tz=tz,
        catch_up=catch_up,
        overlap=overlap,
        start_within_s=start_within_s,
        deadline_s=deadline_s,
    )
    existing = _SCHEDULES.get(name)
    if existing is not None and existing != declared:
        raise ValueError(f"schedule {name!r} is already declared as {existing}")
    _SCHEDULES[name] = declared
    return declared


def declared_schedules(known_tasks: Collection[str]) -> tuple[Schedule, ...]:
    """The schedules the loaded task modules declared, by name; `ConfigError` (one line)
    for one whose task is not registered."""
    out = tuple(sorted(_SCHEDULES.values(), key=lambda s: s.name))
    for s in out:
        if s.task not in known_tasks:
            known = ", ".join(sorted(known_tasks)) or "(none)"
            raise ConfigError(
                f"schedule {s.name!r} names unknown task {s.task!r}; known tasks: {known}"
            )
    return out
