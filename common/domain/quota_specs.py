"""A quota as a client states it: its name, the body of `PUT /quotas/{name}`, a job's
`quotas` (name to cost) and a task's `RateLimited`; each checked before anything is
written (`brook.common.domain.quotas` is what a quota then does)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from brook.common.domain.errors import InvalidInput, invalid_body
from brook.common.domain.numbers import WHOLE

# A quota's name: a provider and a model, say (`openai:gpt-4o`, `anthropic/claude`). No `.`
# or `$` (it is a key of a job's `quotas`), no spaces.
QUOTA_NAME = r"^[A-Za-z0-9][A-Za-z0-9_:/@+-]{0,127}$"
_QUOTA_NAME = re.compile(QUOTA_NAME)
MAX_QUOTA_LIMIT = 10**12
MAX_QUOTA_SECONDS = 86_400.0
MAX_QUOTA_CONCURRENCY = 100_000
MAX_QUOTAS_PER_JOB = 16


class WindowSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: Annotated[int, Strict(), Field(ge=1, le=MAX_QUOTA_LIMIT), WHOLE] = Field(
        description="units (or starts) per window"
    )
    # One strict type, so the document carries its bounds (a union's were left out of it).
    per_seconds: Annotated[float, Strict()] = Field(
        gt=0, le=MAX_QUOTA_SECONDS, description="the window, in seconds"
    )


def _names_a_limit(schema: dict[str, Any]) -> None:
    # What the document can say of "a quota keeps at least one limit" without the quota:
    # a body sets one (a `null` beside it clears another; alone, only while another is set).
    schema["anyOf"] = [
        {"required": [f], "properties": {f: {"type": kind}}}
        for f, kind in (("units", "object"), ("requests", "object"), ("concurrency", "integer"))
    ]


class QuotaUpdate(BaseModel):
    """The body of `PUT /quotas/{name}`: each field given replaces that limit (`null` clears
    it); a field left out keeps its value. A quota must end with at least one."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_names_a_limit)

    units: WindowSpec | None = Field(
        default=None, description="weighted starts (each job's cost) per window; null: none"
    )
    requests: WindowSpec | None = Field(default=None, description="starts per window; null: none")
    concurrency: Annotated[int, Strict(), Field(ge=1, le=MAX_QUOTA_CONCURRENCY), WHOLE] | None = (
        Field(default=None, description="jobs running at once")
    )

    def changes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("units", "requests"):
            if name in self.model_fields_set:
                spec = getattr(self, name)
                out[name] = None if spec is None else _window_doc(spec)
        if "concurrency" in self.model_fields_set:
            out["concurrency"] = self.concurrency
        return out


def _window_doc(spec: WindowSpec) -> dict[str, Any]:
    seconds = float(spec.per_seconds)
    if not math.isfinite(seconds):
        raise InvalidInput("per_seconds must be a finite number")
    return {"limit": spec.limit, "per_seconds": seconds}


def check_quota_name(name: object) -> str:
    if not isinstance(name, str) or not _QUOTA_NAME.fullmatch(name):
        raise InvalidInput(f"{name!r} is not a quota name (pattern {QUOTA_NAME})")
    return name


def validate_quota_update(name: object, body: object) -> dict[str, Any]:
    """The fields a valid `PUT /quotas/{name}` body changes; `InvalidInput` otherwise. Whether
    the quota is left with a limit at all is checked against what it holds (`has_limit`)."""
    check_quota_name(name)
    if not isinstance(body, Mapping):
        raise InvalidInput("the body must be a JSON object")
    try:
        update = QuotaUpdate.model_validate(dict(body))
    except ValidationError as exc:
        raise invalid_body(exc) from None
    return update.changes()


def has_limit(fields: Mapping[str, Any]) -> bool:
    return any(fields.get(f) is not None for f in ("units", "requests", "concurrency"))


NO_LIMIT = "a quota needs at least one of units, requests or concurrency"


# Marks the names of a job's quotas in the API's document: served, they are the quotas set
# now (a job naming another is a `422`: a typo must not mean "no limit").
QUOTA_NAMES_MARK = "x-brook-quota-names"


def job_quotas_schema(schema: dict[str, Any]) -> None:
    """A job's `quotas` in the API's document: what `check_job_quotas` takes, or null."""
    description = schema.get("description")
    schema.clear()
    schema.update(
        anyOf=[
            {
                "type": "object",
                "maxProperties": MAX_QUOTAS_PER_JOB,
                "propertyNames": {"pattern": QUOTA_NAME, QUOTA_NAMES_MARK: True},
                "additionalProperties": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_QUOTA_LIMIT,
                },
            },
            {"type": "null"},
        ],
        description=description,
    )


def check_job_quotas(value: object) -> dict[str, int]:
    """A job's `quotas`: `{name: cost in units}`, each name a quota name, each cost a whole
    number of at least 0. Raises `ValueError` (the spec's validator reports it)."""
    if not isinstance(value, Mapping):
        raise ValueError("must be an object of quota name to cost")
    if len(value) > MAX_QUOTAS_PER_JOB:
        raise ValueError(f"names at most {MAX_QUOTAS_PER_JOB} quotas")
    out: dict[str, int] = {}
    for name, cost in value.items():
        if not isinstance(name, str) or not _QUOTA_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a quota name (pattern {QUOTA_NAME})")
        if isinstance(cost, float) and cost.is_integer():
            cost = int(cost)  # JSON Schema's integer: 4.0 is one
        if isinstance(cost, bool) or not isinstance(cost, int):
            raise ValueError(f"the cost of {name!r} must be a whole number of units")
        if cost < 0:
            raise ValueError(f"the cost of {name!r} must not be negative")
        if cost > MAX_QUOTA_LIMIT:
            raise ValueError(f"the cost of {name!r} is over {MAX_QUOTA_LIMIT}")
        out[name] = cost
    return out


MAX_DELAY_S = 86_400.0


def rate_limited_waiting(name: object, delay: object) -> dict[str, Any] | None:
    """What a job a task's `RateLimited` ended waits for (`waiting_for`: the quota, closed
    `delay` seconds); None for a bad quota name or delay (the attempt fails, as any error)."""
    if not isinstance(name, str) or not _QUOTA_NAME.fullmatch(name):
        return None
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        return None
    if not (math.isfinite(delay) and 0 <= delay <= MAX_DELAY_S):
        return None
    return {"kind": "quota", "name": name, "delay": float(delay), "reason": "rate_limited"}
