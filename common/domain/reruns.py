"""Rerun from a step: what `POST /jobs/{id}/rerun` and `Client.rerun` take, and which job
may be rerun from which step, without a database (the store makes the new job).

A rerun is a new job of the same task, queue, key and payload (or a new payload) that
carries the source job's recorded steps *before* `from_step`, with their output, and runs
the rest. Only a finished job is rerun (completed, failed or cancelled: nothing of it runs
any more), from one of the steps it recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from brook.common.domain.errors import InvalidInput, JobConflict
from brook.common.domain.status import TERMINAL, JobStatus
from brook.common.domain.validation import check_document, pydantic_detail

# Brook's own step names are longer than a user's (`signal:KEY#1.deadline`, a key of up to
# 200 characters): any recorded name fits.
MAX_FROM_STEP = 300
# How many of the job's step names an unknown step's message lists.
NAMES_SHOWN = 20


class RerunBody(BaseModel):
    """The body of `POST /jobs/{id}/rerun`, the arguments of `Client.rerun`."""

    model_config = ConfigDict(extra="forbid")

    from_step: str = Field(
        min_length=1,
        max_length=MAX_FROM_STEP,
        description="the recorded step to run again: the steps before it are carried",
    )
    payload: dict[str, Any] | None = Field(
        default=None, description="the new job's payload (default: the source job's)"
    )

    @field_validator("payload")
    @classmethod
    def _payload(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_document(value)
        return value


@dataclass(frozen=True, kw_only=True)
class Rerun:
    from_step: str
    payload: dict[str, Any] | None = None


def validate_rerun(data: object) -> Rerun:
    """A valid body; `InvalidInput` (the API's 422) otherwise."""
    if not isinstance(data, Mapping):
        raise InvalidInput("body must be a JSON object")
    try:
        body = RerunBody.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(pydantic_detail(exc)) from None
    return Rerun(from_step=body.from_step, payload=body.payload)


def steps_before(
    job_id: str,
    status: str,
    steps: Sequence[Mapping[str, Any]],
    from_step: str,
    failed_in: str | None = None,
) -> list[Mapping[str, Any]]:
    """The recorded steps a rerun from `from_step` carries: those recorded before it, in
    order; from `failed_in`, the step the job failed in (never recorded), all of them.
    `JobConflict` (the API's 409) for a job that has not finished; `InvalidInput` for one
    without steps, or a step it did not record (the message lists the ones it did)."""
    if JobStatus(status) not in TERMINAL:
        raise JobConflict(
            f"job {job_id} is {status}: only a finished job (completed, failed or cancelled) "
            "can be rerun"
        )
    names = [str(s.get("name")) for s in steps]
    if not names:
        raise InvalidInput(
            f"job {job_id} recorded no steps: a rerun starts from one of a job's recorded "
            "steps (ctx.step, ctx.sleep, ctx.wait_for_signal)"
        )
    if from_step in names:
        return list(steps[: names.index(from_step)])
    if from_step == failed_in:
        return list(steps)
    shown = ", ".join(repr(n) for n in names[:NAMES_SHOWN])
    more = f", ... ({len(names)} in all)" if len(names) > NAMES_SHOWN else ""
    failed = f", and {failed_in!r}, the step it failed in" if failed_in else ""
    raise InvalidInput(
        f"job {job_id} has no recorded step {from_step!r}; its steps: {shown}{more}{failed}"
    )
