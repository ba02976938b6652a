"""Edge validation: nothing invalid is ever stored."""

from __future__ import annotations

import itertools
import json
import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

MAX_DEPTH = 32
INT64 = (-(2**63), 2**63 - 1)  # BSON's widest integer
_STRING = re.compile(rb'"(?:\\.|[^"\\])*"')
_BRACKET = re.compile(rb"[\[\]{}]")


# What a 422 carries: one message, or pydantic's errors as {"loc", "msg", "type"}.
ErrorDetail = str | list[dict[str, object]]


class InvalidInput(Exception):
    def __init__(self, detail: ErrorDetail) -> None:
        super().__init__(str(detail))
        self.detail = detail


class SubmitJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, max_length=200)
    payload: dict[str, Any] = Field(default_factory=dict)
    priority: StrictInt = Field(default=0, ge=-1_000_000, le=1_000_000)
    run_at: datetime | None = None
    max_attempts: StrictInt = Field(default=3, ge=1, le=1000)
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 86400)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=256)

    @field_validator("run_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        # BSON dates have millisecond precision.
        return value.replace(microsecond=value.microsecond // 1000 * 1000)

    @field_validator("payload")
    @classmethod
    def _payload(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_document(value)
        return value


def body_depth(raw: bytes) -> int:
    """Nesting depth of a JSON text, counted without parsing (so a deep body cannot recurse)."""
    stripped = _STRING.sub(b'""', raw)
    steps = (1 if b in (b"[", b"{") else -1 for b in _BRACKET.findall(stripped))
    return max(itertools.accumulate(steps, initial=0))


def check_document(value: object, path: str = "payload", depth: int = 1) -> None:
    """MongoDB-safe: no key starting with `$`, no NUL in keys, nesting at most 32, integers
    that fit in 64 bits."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nesting deeper than {MAX_DEPTH}")
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        raise ValueError(f"{path}: integer {value} does not fit in 64 bits")
    if isinstance(value, dict):
        for key, item in value.items():
            if key.startswith("$"):
                raise ValueError(f"{path}: key {key!r} starts with '$'")
            if "\x00" in key:
                raise ValueError(f"{path}: key {key!r} contains a NUL character")
            check_document(item, f"{path}.{key}", depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_document(item, f"{path}[{index}]", depth + 1)


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is not a JSON number")


def parse_submit(raw: bytes) -> SubmitJob:
    if body_depth(raw) > MAX_DEPTH + 1:
        raise InvalidInput(f"body: nesting deeper than {MAX_DEPTH}")
    try:
        data = json.loads(raw, parse_constant=_not_json)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput("body must be a JSON object")
    try:
        return SubmitJob.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(
            [
                {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
                for e in exc.errors(include_url=False, include_context=False, include_input=False)
            ]
        ) from None
