"""One root exception; every error Brook raises on purpose derives from it."""

from __future__ import annotations


class BrookError(Exception):
    """Root of Brook's own errors."""


class ConfigError(BrookError):
    """A `BROOK_*` variable has a bad value; the message names it."""


class JobNotFound(BrookError):
    """No job has that id."""


class JobConflict(BrookError):
    """The job is in a state that does not allow the operation (e.g. cancel a finished job)."""


class LeaseLost(BrookError):
    """A fenced write matched nothing: another attempt or owner holds the job now."""


class UnknownTask(BrookError):
    """A job names a task that no registered module provides."""


class Retry(BrookError):
    """Raised by a task to ask for another attempt after `delay` seconds."""

    def __init__(self, delay: float | None = None, message: str = "retry requested") -> None:
        super().__init__(message)
        self.delay = delay


class EmbeddedMongoError(BrookError):
    """The embedded replica set could not be started, stopped or reached."""


class ScheduleNotFound(BrookError):
    """No schedule has that name (no dispatcher has declared it)."""
