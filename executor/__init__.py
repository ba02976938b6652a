"""Worker processes and the task registry. Task modules need only this::

from executor import Retry, SyncTaskContext, TaskContext, task
"""

from common.errors import Retry
from executor.context import SyncTaskContext, TaskContext
from executor.registry import task

__all__ = ["Retry", "SyncTaskContext", "TaskContext", "task"]
