"""Worker processes, the task registry and cron schedules. Task modules need only this::

from executor import Retry, TaskContext, schedule, task
"""

from common.errors import Retry
from executor.context import TaskContext
from executor.registry import task
from executor.schedules import schedule

__all__ = ["Retry", "TaskContext", "schedule", "task"]
