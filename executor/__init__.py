"""Worker processes, the task registry, cron schedules and triggers (internal).

Task modules import the public names from `brook`, which re-exports these::

    from brook import Retry, SyncTaskContext, TaskContext, schedule, task, trigger

`executor` never imports `brook` (it is the floor below), so those names are defined here.
"""

from brook.common.domain.errors import Retry
from brook.executor.context import SyncTaskContext, TaskContext
from brook.executor.registry import task
from brook.executor.schedules import schedule
from brook.executor.triggers import trigger

__all__ = ["Retry", "SyncTaskContext", "TaskContext", "schedule", "task", "trigger"]
