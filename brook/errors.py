"""Brook's public errors, under one root: everything Brook raises on purpose is a
`BrookError`.

    from brook.errors import LeaseLost, Retry, WaitTimeout

(`from brook import ...` gives the same classes.)
"""

from __future__ import annotations

from brook.common.domain.errors import (
    BrookError,
    ConfigError,
    DuplicateStep,
    EmbeddedMongoError,
    InvalidInput,
    InvalidSession,
    JobConflict,
    JobNotFound,
    LeaseLost,
    OutputLimitExceeded,
    QuotaNotFound,
    RateLimited,
    Retry,
    ScheduleNotFound,
    SearchTooBroad,
    SignalTimeout,
    StepError,
    TriggerNotFound,
    UnknownParent,
    UnknownTask,
    WaitTimeout,
)

__all__ = [
    "BrookError",
    "ConfigError",
    "DuplicateStep",
    "EmbeddedMongoError",
    "InvalidInput",
    "InvalidSession",
    "JobConflict",
    "JobNotFound",
    "LeaseLost",
    "OutputLimitExceeded",
    "QuotaNotFound",
    "RateLimited",
    "Retry",
    "ScheduleNotFound",
    "SearchTooBroad",
    "SignalTimeout",
    "StepError",
    "TriggerNotFound",
    "UnknownParent",
    "UnknownTask",
    "WaitTimeout",
]
