"""Brook: an event-driven job engine on MongoDB. The Python API::

    from brook import Client, AsyncClient
"""

from brook.client import AsyncClient, Client
from common.domain.errors import (
    BrookError,
    InvalidInput,
    InvalidSession,
    JobConflict,
    JobNotFound,
    WaitTimeout,
)
from common.domain.models import Job
from common.domain.status import JobStatus

__all__ = [
    "AsyncClient",
    "BrookError",
    "Client",
    "InvalidInput",
    "InvalidSession",
    "Job",
    "JobConflict",
    "JobNotFound",
    "JobStatus",
    "WaitTimeout",
]
