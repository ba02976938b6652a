"""Worker processes, the task registry and cron schedules. Task modules need only this::

from executor import Retry, SyncTaskContext, TaskContext, schedule, task
"""

from common.domain.errors import Retry
from executor.context import SyncTaskContext, TaskContext
from executor.registry import task
from executor.schedules import schedule

__all__ = ["Retry", "SyncTaskContext", "TaskContext", "schedule", "task"]
