"""Brook: an event-driven job engine on MongoDB. One import for everything public::

    from brook import task, schedule, trigger, TaskContext, Retry   # in a task module
    from brook import Client, AsyncClient                  # in an application

Importing `brook` opens no connection and starts nothing: a `Client` connects when it
is created, and a task module only registers its tasks. `executor`, `dispatcher`,
`ingest` and `common` are internal packages; `brook` sits above them and none of them
imports it, so a task module that imports `brook` is loaded without a cycle by the API,
a dispatcher and each worker process.

Each name is imported when it is first used (PEP 562), not with the package: the `brook`
command imports `brook.cli`, and a command that only speaks HTTP (`brook ls`, `brook
queue set`, ...) then starts without loading the client, PyMongo or the task runtime
(`brook --help` in 0.3 s instead of 0.6 on a 2-core host).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker and an editor see; at run time, `__getattr__`
    from brook.client import AsyncClient, Client
    from brook.common.domain.errors import (
        BrookError,
        ConfigError,
        EmbeddedMongoError,
        InvalidInput,
        InvalidSession,
        JobConflict,
        JobNotFound,
        LeaseLost,
        Retry,
        ScheduleNotFound,
        TriggerNotFound,
        UnknownTask,
        WaitTimeout,
    )
    from brook.common.domain.models import Job
    from brook.common.domain.status import JobStatus
    from brook.common.domain.steps import DuplicateStep, SignalTimeout, StepError
    from brook.executor.context import SyncTaskContext, TaskContext
    from brook.executor.registry import task
    from brook.executor.schedules import schedule
    from brook.executor.triggers import trigger

# Where each public name lives.
_ERRORS = "brook.common.domain.errors"
_HOME = {
    "AsyncClient": "brook.client",
    "Client": "brook.client",
    "BrookError": _ERRORS,
    "ConfigError": _ERRORS,
    "EmbeddedMongoError": _ERRORS,
    "InvalidInput": _ERRORS,
    "InvalidSession": _ERRORS,
    "JobConflict": _ERRORS,
    "JobNotFound": _ERRORS,
    "LeaseLost": _ERRORS,
    "Retry": _ERRORS,
    "ScheduleNotFound": _ERRORS,
    "TriggerNotFound": _ERRORS,
    "UnknownTask": _ERRORS,
    "WaitTimeout": _ERRORS,
    "Job": "brook.common.domain.models",
    "JobStatus": "brook.common.domain.status",
    "DuplicateStep": "brook.common.domain.steps",
    "SignalTimeout": "brook.common.domain.steps",
    "StepError": "brook.common.domain.steps",
    "SyncTaskContext": "brook.executor.context",
    "TaskContext": "brook.executor.context",
    "task": "brook.executor.registry",
    "schedule": "brook.executor.schedules",
    "trigger": "brook.executor.triggers",
}

__all__ = [
    "AsyncClient",
    "BrookError",
    "Client",
    "ConfigError",
    "DuplicateStep",
    "EmbeddedMongoError",
    "InvalidInput",
    "InvalidSession",
    "Job",
    "JobConflict",
    "JobNotFound",
    "JobStatus",
    "LeaseLost",
    "Retry",
    "ScheduleNotFound",
    "SignalTimeout",
    "StepError",
    "SyncTaskContext",
    "TaskContext",
    "TriggerNotFound",
    "UnknownTask",
    "WaitTimeout",
    "schedule",
    "task",
    "trigger",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'brook' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
