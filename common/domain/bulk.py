"""Bulk operations: which jobs a `POST /jobs/retry` or `POST /jobs/cancel` (and the client's
`retry_many` / `cancel_many`, and `brook retry` / `brook cancel` with filters) acts on.

A filter names any of: statuses, task, queue, key, the type of the error the job ended
with, and a range of `created_at` and of `finished_at` (`*_since` inclusive, `*_until`
exclusive). An empty filter is refused: "every job" is never an accident. Only the jobs an
operation can change are counted and changed: a retry takes failed or cancelled jobs, a
cancel waiting, pending or running ones, whatever else the filter names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from brook.common.domain.errors import InvalidInput
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


@dataclass(frozen=True, kw_only=True)
class JobFilter:
    statuses: frozenset[JobStatus] = frozenset()
    task: str | None = None
    queue: str | None = None
    key: str | None = None
    error_type: str | None = None
    created_since: datetime | None = None
    created_until: datetime | None = None
    finished_since: datetime | None = None
    finished_until: datetime | None = None

    def statuses_for(self, action: BulkAction) -> list[str]:
        """The statuses this action changes among those asked for (all it can, if none)."""
        can = ACTS_ON[action]
        chosen = (self.statuses & can) if self.statuses else can
        return sorted(s.value for s in chosen)


class BulkBody(BaseModel):
    """The body of `POST /jobs/retry` and `POST /jobs/cancel`."""

    model_config = ConfigDict(extra="forbid")

    status: list[JobStatus] | JobStatus | None = Field(
        default=None, description="a status, or a list of them"
    )
    task: str | None = Field(default=None, min_length=1, max_length=200)
    queue: str | None = Field(default=None, pattern=QUEUE_NAME)
    key: str | None = Field(default=None, min_length=1, max_length=256)
    error_type: str | None = Field(
        default=None, min_length=1, max_length=200, description="the `error.type` it ended with"
    )
    created_since: datetime | None = None
    created_until: datetime | None = None
    finished_since: datetime | None = None
    finished_until: datetime | None = None
    dry_run: StrictBool = Field(default=False, description="only count the jobs it would change")

    @field_validator("created_since", "created_until", "finished_since", "finished_until")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)

    def to_filter(self) -> JobFilter:
        status = self.status
        statuses = [] if status is None else status if isinstance(status, list) else [status]
        return JobFilter(
            statuses=frozenset(statuses),
            task=self.task,
            queue=self.queue,
            key=self.key,
            error_type=self.error_type,
            created_since=self.created_since,
            created_until=self.created_until,
            finished_since=self.finished_since,
            finished_until=self.finished_until,
        )


def validate_bulk(body: Any) -> tuple[JobFilter, bool]:
    """The filter and `dry_run` of a valid body; `InvalidInput` (the API's 422) otherwise."""
    if not isinstance(body, Mapping):
        raise InvalidInput("the body must be a JSON object")
    try:
        parsed = BulkBody.model_validate(dict(body))
    except ValidationError as exc:
        raise InvalidInput(
            [
                {"loc": ["body", *e.get("loc", ())], "msg": e.get("msg"), "type": e.get("type")}
                for e in exc.errors(include_url=False, include_context=False, include_input=False)
            ]
        ) from None
    if not (parsed.model_fields_set - {"dry_run"}):
        raise InvalidInput("give at least one filter field (status, task, queue, key, ...)")
    return parsed.to_filter(), parsed.dry_run
