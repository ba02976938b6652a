"""Worker processes and the task registry. Task modules need only this::

from executor import Retry, TaskContext, task
"""

from common.errors import Retry
from executor.context import TaskContext
from executor.registry import task

__all__ = ["Retry", "TaskContext", "task"]
