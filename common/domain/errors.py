"""Every public error, under one root: each error Brook raises on purpose derives from
`BrookError`. Users import them from `brook.errors` (or `brook`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


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


class OutputLimitExceeded(BrookError, ValueError):
    """`ctx.emit` past a cap: a chunk over its size limit, or a job whose output would pass
    its cap of chunks or bytes. The chunk is not kept; what came before it is."""


class QuotaNotFound(BrookError, LookupError):
    """No quota has that name."""


class RateLimited(BrookError):
    """Raised by a task when a provider refused a call for a quota's limit (its `429`):
    `quota` is closed for every dispatcher until `delay` seconds from now (its
    `Retry-After`), and this job goes back to pending, due then, its attempts untouched."""

    def __init__(self, quota: str, delay: float = 1.0, message: str = "rate limited") -> None:
        super().__init__(message)
        self.quota = quota
        self.delay = delay

    def __reduce__(self) -> tuple[object, ...]:
        return (RateLimited, (self.quota, self.delay, self.args[0] if self.args else ""))


class UnknownTask(BrookError):
    """A job names a task that no registered module provides."""


# What a 422 carries: one message, or pydantic's errors as {"loc", "msg", "type"}.
ErrorDetail = str | list[dict[str, object]]


class InvalidInput(BrookError):
    """A job spec that would not be stored: `detail` is exactly what the API's `422` says."""

    def __init__(self, detail: ErrorDetail) -> None:
        super().__init__(_readable(detail))
        self.detail = detail


def invalid_body(exc: ValidationError) -> InvalidInput:
    """A request body's validation errors as the API's `422` detail, each `loc` under
    `body` (a queue's, a quota's, a bulk action's)."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    return InvalidInput(
        [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in errors]
    )


class UnknownParent(InvalidInput):
    """A spec's `depends_on` names no job (nor a ref of its batch): the API's `404`, whose
    detail names each (`loc` `["depends_on", i]`, `type` `unknown_parent`)."""


def _readable(detail: ErrorDetail) -> str:
    if isinstance(detail, str):
        return detail
    parts = []
    for error in detail:
        loc = error.get("loc")
        where = ".".join(str(p) for p in loc) if isinstance(loc, list) and loc else "body"
        parts.append(f"{where}: {error.get('msg')}")
    return "; ".join(parts)


class SearchTooBroad(BrookError):
    """A listing, search or grouping read more than its time bound (`BROOK_QUERY_MAX_MS`)
    allows before it finished: the filters leave too many jobs to read. The API answers
    `422` with `code` `search_too_broad`."""

    code = "search_too_broad"


class InvalidSession(BrookError, ValueError):
    """A `session=` Brook cannot write with: from another client than the one it wraps, or
    not in a transaction."""


class WaitTimeout(BrookError, TimeoutError):
    """`wait(id, timeout)` ran out of time before the job finished."""


class Retry(BrookError):
    """Raised by a task to ask for another attempt after `delay` seconds."""

    def __init__(self, delay: float | None = None, message: str = "retry requested") -> None:
        super().__init__(message)
        self.delay = delay


class EmbeddedMongoError(BrookError):
    """The embedded replica set could not be started, stopped or reached."""


class ScheduleNotFound(BrookError):
    """No schedule has that name (no dispatcher has declared it)."""


class TriggerNotFound(BrookError):
    """No trigger has that name (no dispatcher has declared it)."""


class StepError(BrookError, ValueError):
    """A step Brook cannot record: a bad or repeated name, a result that is not BSON or too
    large. The message names the step."""


class DuplicateStep(StepError):
    """Two steps of one run have the same name."""


class SignalTimeout(BrookError, TimeoutError):
    """`ctx.wait_for_signal(key, timeout=...)`: no signal came for `key` in time."""
