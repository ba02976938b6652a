"""Brook: an event-driven job engine on MongoDB. One import for everything public::

    from brook import task, schedule, trigger, TaskContext, Retry   # in a task module
    from brook import Client, AsyncClient                  # in an application

Importing `brook` opens no connection and starts nothing: a `Client` connects when it
is created, and a task module only registers its tasks. `executor`, `dispatcher`,
`ingest` and `common` are internal packages; `brook` sits above them and none of them
imports it, so a task module that imports `brook` is loaded without a cycle by the API,
a dispatcher and each worker process.
"""

from brook.client import AsyncClient, Client
from common.domain.errors import (
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
from common.domain.models import Job
from common.domain.status import JobStatus
from common.domain.steps import DuplicateStep, SignalTimeout, StepError
from executor.context import SyncTaskContext, TaskContext
from executor.registry import task
from executor.schedules import schedule
from executor.triggers import trigger

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
