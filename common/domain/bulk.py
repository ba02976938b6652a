"""Bulk operations: which jobs a `POST /jobs/retry` or `POST /jobs/cancel` (and the client's
`retry_many` / `cancel_many`, and `brook retry` / `brook cancel` with filters) acts on.

A filter names any of: statuses, task, queue, key, the type of the error the job ended
with, and a range of `created_at` and of `finished_at` (`*_since` inclusive, `*_until`
exclusive). An empty filter is refused: "every job" is never an accident. Only the jobs an
operation can change are counted and changed: a retry takes failed or cancelled jobs, a
cancel waiting, pending or running ones, whatever else the filter names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from brook.common.domain.errors import InvalidInput, invalid_body
from brook.common.domain.instants import Instant as IsoInstant
from brook.common.domain.models import QUEUE_NAME
from brook.common.domain.status import JobStatus

BulkAction = Literal["retry", "cancel"]
# What each operation can change.
ACTS_ON: dict[BulkAction, frozenset[JobStatus]] = {
    "retry": frozenset({JobStatus.FAILED, JobStatus.CANCELLED}),
    "cancel": frozenset({JobStatus.WAITING, JobStatus.PENDING, JobStatus.RUNNING}),
}
# Jobs changed per write: each page is one read of ids and one conditional write.
PAGE = 500


Statuses = str | Sequence[str]
Instant = datetime | str


@dataclass(frozen=True, kw_only=True)
class JobFilter:
    """The jobs a bulk retry or cancel names: one type for the Python client
    (`client.retry_many(JobFilter(...))`, or its fields as keywords), the HTTP body of
    `POST /jobs/retry|cancel` and the options of `brook retry|cancel`. Each field left as
    None names nothing; `status` is one status or several; times are `datetime`s (naive
    ones read as UTC) or ISO strings.

    Checked when made: a bad value raises `InvalidInput` (the API's `422`), and what it
    holds is read into `JobStatus`es (`status`, a tuple) and UTC `datetime`s.
    """

    status: Statuses | None = None
    task: str | None = None
    queue: str | None = None
    key: str | None = None
    error_type: str | None = None
    created_since: Instant | None = None
    created_until: Instant | None = None
    finished_since: Instant | None = None
    finished_until: Instant | None = None

    def __post_init__(self) -> None:
        checked = _parse(self.given())
        status = checked.status
        if status is not None:
            object.__setattr__(
                self, "status", tuple(status if isinstance(status, list) else [status])
            )
        for name in ("created_since", "created_until", "finished_since", "finished_until"):
            object.__setattr__(self, name, getattr(checked, name))

    def given(self) -> dict[str, Any]:
        """The fields given (not None), named as in the HTTP body; `status` as a list."""
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        status = given["status"]
        if status is not None and not isinstance(status, str):
            given["status"] = list(status)
        return {name: value for name, value in given.items() if value is not None}

    def statuses_for(self, action: BulkAction) -> list[str]:
        """The statuses this action changes among those asked for (all it can, if none)."""
        can = ACTS_ON[action]
        asked = frozenset(JobStatus(s) for s in self.status or ())
        chosen = (asked & can) if asked else can
        return sorted(s.value for s in chosen)


FILTER_FIELDS = (
    "status",
    "task",
    "queue",
    "key",
    "error_type",
    "created_since",
    "created_until",
    "finished_since",
    "finished_until",
)


def _names_a_filter(schema: dict[str, Any]) -> None:
    """The document says what `validate_bulk` checks: at least one filter field, not null."""
    schema["anyOf"] = [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in FILTER_FIELDS
    ]


class BulkBody(BaseModel):
    """The body of `POST /jobs/retry` and `POST /jobs/cancel`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_names_a_filter)

    status: Annotated[list[JobStatus], Field(min_length=1)] | JobStatus | None = Field(
        default=None, description="a status, or a non-empty list of them"
    )
    task: str | None = Field(default=None, min_length=1, max_length=200)
    queue: str | None = Field(default=None, pattern=QUEUE_NAME)
    key: str | None = Field(default=None, min_length=1, max_length=256)
    error_type: str | None = Field(
        default=None, min_length=1, max_length=200, description="the `error.type` it ended with"
    )
    created_since: IsoInstant | None = None
    created_until: IsoInstant | None = None
    finished_since: IsoInstant | None = None
    finished_until: IsoInstant | None = None
    dry_run: StrictBool = Field(default=False, description="only count the jobs it would change")

    def to_filter(self) -> JobFilter:
        return JobFilter(**self.model_dump(exclude={"dry_run"}, exclude_none=True))


def _parse(body: Mapping[str, Any]) -> BulkBody:
    """A valid body; `InvalidInput` (the API's 422) otherwise."""
    try:
        return BulkBody.model_validate(dict(body))
    except ValidationError as exc:
        raise invalid_body(exc) from None


def validate_bulk(body: Any) -> tuple[JobFilter, bool]:
    """The filter and `dry_run` of a valid body; `InvalidInput` (the API's 422) otherwise."""
    if not isinstance(body, Mapping):
        raise InvalidInput("the body must be a JSON object")
    parsed = _parse(body)
    if all(getattr(parsed, name) is None for name in FILTER_FIELDS):
        raise InvalidInput("give at least one filter field (status, task, queue, key, ...)")
    return parsed.to_filter(), parsed.dry_run
