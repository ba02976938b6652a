"""What a job spec may hold: one validator for the HTTP API and the Python client alike.

Both hand it the same JSON-shaped data (the API after parsing the body, the client from
its arguments), so they reject the same inputs with the same `InvalidInput.detail`, the
API's `422` detail. Nothing invalid is ever stored.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from brook.common.domain.errors import ErrorDetail, InvalidInput
from brook.common.domain.instants import IsoDateTime
from brook.common.domain.models import DEFAULT_QUEUE, QUEUE_NAME, JobSpec, whole_ms
from brook.common.domain.numbers import WHOLE
from brook.common.domain.quota_specs import check_job_quotas, job_quotas_schema
from brook.common.domain.schedules import TICK_KEY_PREFIX
from brook.common.domain.triggers import TRIGGER_KEY_PREFIX
from brook.common.domain.workflows import MAX_PARENTS, check_graph

MAX_DEPTH = 32
MAX_BATCH = 1000
INT64 = (-(2**63), 2**63 - 1)
DAY_S = 86400.0
# How far ahead a job may be due (`run_at`, `delay`): a year. Further is refused, so no
# date arithmetic on a job (backoff, a schedule's horizon) can overflow.
MAX_HORIZON_S = 365 * DAY_S
EARLIEST_RUN_AT = datetime(1970, 1, 1, tzinfo=UTC)

# Marks the `task` field in the API's document, where the names known when it is served go.
TASK_MARK = "x-brook-task"
# Marks `run_at`, whose latest year (365 days ahead) the document says when it is served.
RUN_AT_MARK = "x-brook-run-at"
# Marks `retention_s`, whose maximum is the API's BROOK_RETENTION_MAX_SECONDS.
RETENTION_MARK = "x-brook-retention"

ParentName = Annotated[str, StringConstraints(min_length=1, max_length=256)]


def _given(*names: str) -> dict[str, Any]:
    """JSON Schema: each of these fields is there and not null."""
    return {
        "required": list(names),
        "properties": {name: {"not": {"type": "null"}} for name in names},
    }


def _not_given(name: str) -> dict[str, Any]:
    return {"not": _given(name)}


# What `SubmitJob`'s model validators check, as the OpenAPI document states it.
_TOGETHER: list[dict[str, Any]] = [
    {"not": _given("run_at", "delay")},
    {"not": _given("start_by", "start_within_s")},
    {"not": _given("deadline", "deadline_s")},
    {"anyOf": [_not_given("unique_for_s"), _given("idempotency_key")]},
    {
        "anyOf": [
            _given("debounce_key", "debounce_s"),
            {"allOf": [_not_given("debounce_key"), _not_given("debounce_s")]},
        ]
    },
    {"anyOf": [_not_given("debounce_max_s"), _given("debounce_key")]},
    {
        "anyOf": [
            _not_given("debounce_key"),
            {
                "allOf": [
                    _not_given(n)
                    for n in ("idempotency_key", "run_at", "delay", "depends_on", "ref")
                ]
            },
        ]
    },
]


# What `check_document` takes, as JSON Schema (but the nesting limit, which it cannot say):
# keys neither starting with `$` nor holding a NUL, integers of 64 bits. `PAYLOAD_DEFS` go
# in a schema's `$defs` (the API's document moves them to its components).
_VALUE_REF = {"$ref": "#/$defs/PayloadValue"}
PAYLOAD_OBJECT: dict[str, Any] = {
    "type": "object",
    "propertyNames": {"pattern": "^(?:[^$\\u0000][^\\u0000]*)?$"},
    "additionalProperties": _VALUE_REF,
}
PAYLOAD_DEFS: dict[str, Any] = {
    "PayloadValue": {
        "anyOf": [
            {"type": ["null", "boolean", "string"]},
            {"type": "integer", "minimum": INT64[0], "maximum": INT64[1]},
            {"type": "number", "not": {"type": "integer"}},
            {"type": "array", "items": _VALUE_REF},
            PAYLOAD_OBJECT,
        ]
    }
}


def spec_schema() -> dict[str, Any]:
    """`SubmitJob`'s JSON Schema with its payload's rules (after pydantic made it: it
    resolves every `$ref` of a model's schema itself, and knows not `PayloadValue`)."""
    schema = SubmitJob.model_json_schema()
    schema["properties"]["payload"] = {**PAYLOAD_OBJECT, "description": "any JSON object"}
    schema.setdefault("$defs", {}).update(PAYLOAD_DEFS)
    return schema


def _document_rules(schema: dict[str, Any]) -> None:
    schema["allOf"] = _TOGETHER
    key = schema["properties"]["idempotency_key"]
    key["not"] = {"pattern": f"^({TICK_KEY_PREFIX}|{TRIGGER_KEY_PREFIX})"}


class SubmitJob(BaseModel):
    """One job spec: the body of `POST /jobs`, an item of `POST /jobs/batch`, the arguments
    of `Client.submit`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_document_rules)

    task: str = Field(
        min_length=1,
        max_length=200,
        json_schema_extra={TASK_MARK: True},
        description="a task this API or a live dispatcher runs (the document lists them)",
    )
    payload: dict[str, Any] = Field(default_factory=dict)
    queue: str = Field(default=DEFAULT_QUEUE, pattern=QUEUE_NAME)
    priority: Annotated[int, Strict(), Field(ge=-1_000_000, le=1_000_000), WHOLE] = 0
    run_at: IsoDateTime | None = Field(
        default=None,
        json_schema_extra={RUN_AT_MARK: True},
        description="ISO-8601; at most 365 days ahead; a time before 1970 is read as 1970 (due)",
    )
    delay: Annotated[float, Strict(), Field(ge=0, le=MAX_HORIZON_S)] | None = Field(
        default=None, description="seconds"
    )
    max_attempts: Annotated[int, Strict(), Field(ge=1, le=1000), WHOLE] = 3
    timeout_s: Annotated[float, Strict(), Field(gt=0, le=7 * DAY_S)] | None = None
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=256)
    unique_for_s: Annotated[float, Strict(), Field(gt=0, le=365 * DAY_S)] | None = None
    retention_s: Annotated[float, Strict(), Field(ge=0, le=100 * 365 * DAY_S)] | None = Field(
        default=None,
        json_schema_extra={RETENTION_MARK: True},
        description="seconds; at most BROOK_RETENTION_MAX_SECONDS (the document says it)",
    )
    depends_on: list[ParentName] | None = Field(
        default=None,
        max_length=MAX_PARENTS,
        description="job ids, or refs of specs in the same batch, that must end first",
    )
    ref: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="a name the other specs of the same batch may list in depends_on",
    )
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="whose job this is: a queue's per-key limits and fair claiming count by it",
    )
    debounce_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="submits with this key while its job is pending join that job",
    )
    debounce_s: Annotated[float, Strict(), Field(gt=0, le=DAY_S)] | None = Field(
        default=None, description="run once no submit joined for this long"
    )
    debounce_max_s: Annotated[float, Strict(), Field(gt=0, le=7 * DAY_S)] | None = Field(
        default=None,
        description="run at most this long after the first submit (default 10 x debounce_s)",
    )
    run_on_parent_failure: StrictBool = Field(
        default=False,
        description="run once every parent ended, even if one failed or was cancelled",
    )
    quotas: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra=job_quotas_schema,
        description="the quotas it draws on, each with its cost in units (an estimate)",
    )
    start_by: IsoDateTime | None = Field(
        default=None,
        json_schema_extra={RUN_AT_MARK: True},
        description="ISO-8601, at most 365 days ahead: not started by then, cancelled "
        "(StartByPassed)",
    )
    start_within_s: Annotated[float, Strict(), Field(gt=0, le=MAX_HORIZON_S)] | None = Field(
        default=None, description="start_by, counted from the submit"
    )
    deadline: IsoDateTime | None = Field(
        default=None,
        json_schema_extra={RUN_AT_MARK: True},
        description="ISO-8601, at most 365 days ahead: unfinished then, failed "
        "(DeadlineExceeded), never retried",
    )
    deadline_s: Annotated[float, Strict(), Field(gt=0, le=MAX_HORIZON_S)] | None = Field(
        default=None, description="deadline, counted from the submit"
    )

    @field_validator("run_at", "start_by", "deadline")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        try:
            value = whole_ms(value.astimezone(UTC))
        except OverflowError:  # year 1 or 9999 moved by its offset past datetime's range
            if value.year > 1:
                raise ValueError("is out of range") from None
            value = EARLIEST_RUN_AT
        # Long past is due now, as any past time: read as 1970, whose arithmetic (a lag, a
        # backoff) cannot leave datetime's range.
        value = max(value, EARLIEST_RUN_AT)
        if value > datetime.now(UTC) + timedelta(seconds=MAX_HORIZON_S):
            raise ValueError("must be at most 365 days ahead")
        return value

    @field_validator("payload")
    @classmethod
    def _payload(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_document(value)
        return value

    @field_validator("quotas")
    @classmethod
    def _quotas(cls, value: dict[str, Any] | None) -> dict[str, int] | None:
        return None if value is None else check_job_quotas(value)

    @field_validator("idempotency_key")
    @classmethod
    def _not_a_tick_key(cls, value: str | None) -> str | None:
        # The keys of cron ticks' jobs: a client may not forge one and take a tick's place.
        if value is not None and value.startswith(TICK_KEY_PREFIX):
            raise ValueError(f"keys starting with {TICK_KEY_PREFIX!r} belong to schedules")
        if value is not None and value.startswith(TRIGGER_KEY_PREFIX):
            raise ValueError(f"keys starting with {TRIGGER_KEY_PREFIX!r} belong to triggers")
        return value

    @field_validator("depends_on")
    @classmethod
    def _each_parent_once(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else list(dict.fromkeys(value))

    @model_validator(mode="after")
    def _together(self) -> SubmitJob:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        if self.unique_for_s is not None and self.idempotency_key is None:
            raise ValueError("unique_for_s needs an idempotency_key")
        self._debounce_together()
        self._deadlines_together()
        return self

    def _deadlines_together(self) -> None:
        for absolute, relative in (("start_by", "start_within_s"), ("deadline", "deadline_s")):
            if getattr(self, absolute) is not None and getattr(self, relative) is not None:
                raise ValueError(f"give {absolute} or {relative}, not both")
        # When it is due and its start_by, on one clock where both are known here (a time
        # counted from the submit is read on this host's clock: within a round trip).
        now = datetime.now(UTC)
        due = self.run_at or (now + timedelta(seconds=self.delay) if self.delay else None)
        latest = self.start_by
        if latest is None and self.start_within_s is not None:
            latest = now + timedelta(seconds=self.start_within_s)
        if due is None or latest is None:
            return
        if self.run_at is None and self.start_by is None:  # both counted from the submit
            late = (self.delay or 0.0) > (self.start_within_s or 0.0)
        else:
            late = due > latest
        if late:
            given = "run_at" if self.run_at is not None else "delay"
            bound = "start_by" if self.start_by is not None else "start_within_s"
            raise ValueError(f"{given} is later than {bound}: the job could never start")

    def _debounce_together(self) -> None:
        if (self.debounce_key is None) != (self.debounce_s is None):
            raise ValueError("give debounce_key and debounce_s together")
        if self.debounce_key is None:
            if self.debounce_max_s is not None:
                raise ValueError("debounce_max_s needs debounce_key and debounce_s")
            return
        others = {
            "idempotency_key": self.idempotency_key,
            "run_at": self.run_at,
            "delay": self.delay,
            "depends_on": self.depends_on,
            "ref": self.ref,
        }
        given = [name for name, value in others.items() if value is not None]
        if given:
            raise ValueError(f"a debounced job takes no {given[0]}")

    def to_spec(self) -> JobSpec:
        return JobSpec(
            task=self.task,
            payload=self.payload,
            queue=self.queue,
            priority=self.priority,
            run_at=self.run_at,
            delay_s=self.delay,
            max_attempts=self.max_attempts,
            timeout_s=self.timeout_s,
            idempotency_key=self.idempotency_key,
            unique_for_s=self.unique_for_s,
            retention_s=self.retention_s,
            depends_on=tuple(self.depends_on or ()),
            ref=self.ref,
            run_on_parent_failure=self.run_on_parent_failure,
            key=self.key,
            debounce_key=self.debounce_key,
            debounce_s=self.debounce_s,
            debounce_max_s=self.debounce_max_s,
            quotas=self.quotas,
            start_by=self.start_by,
            start_within_s=self.start_within_s,
            deadline=self.deadline,
            deadline_s=self.deadline_s,
        )


class SubmitBatch(BaseModel):
    """The body of `POST /jobs/batch`; `Client.submit_many` validates its list as this."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[SubmitJob] = Field(min_length=1, max_length=MAX_BATCH)


# A path to a value: its parent's path and its key or index (built only for a message, so
# walking a document costs time linear in its size however long its keys are).
_Path = tuple["_Path | None", str | int]
MESSAGE_KEY_CHARS = 60  # a key quoted in a message is cut to this (a key may be megabytes)


def check_document(value: object, path: str = "payload", depth: int = 1) -> None:
    """MongoDB-safe JSON: no key starting with `$`, no NUL in keys, nesting at most 32,
    integers that fit in 64 bits (what BSON stores), finite numbers, only JSON types."""
    _check(value, (None, path), depth)


def _check(value: object, at: _Path, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"{_name(at)}: nesting deeper than {MAX_DEPTH}")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_key(key, at)
            _check(item, (at, key), depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check(item, (at, index), depth + 1)
    else:
        _check_scalar(value, at)


def _short(key: object) -> str:
    text = repr(key)
    return text if len(text) <= MESSAGE_KEY_CHARS else text[: MESSAGE_KEY_CHARS - 3] + "..."


def _name(at: _Path) -> str:
    """`payload.a[0].b`, each key cut short."""
    parts: list[str] = []
    node: _Path | None = at
    while node is not None:
        parent, part = node
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif parent is None:
            parts.append(part)
        else:
            text = part if len(part) <= MESSAGE_KEY_CHARS else part[: MESSAGE_KEY_CHARS - 3] + "..."
            parts.append(f".{text}")
        node = parent
    return "".join(reversed(parts))


def _check_key(key: object, at: _Path) -> None:
    if not isinstance(key, str):
        raise ValueError(f"{_name(at)}: key {_short(key)} is not a string")
    if key.startswith("$"):
        raise ValueError(f"{_name(at)}: key {_short(key)} starts with '$'")
    if "\x00" in key:
        raise ValueError(f"{_name(at)}: key {_short(key)} contains a NUL character")
    _check_text(key, at)


def _check_text(text: str, at: _Path) -> None:
    # JSON may escape half a surrogate pair (`"\ud800"`): no UTF-8 text, so BSON cannot
    # store it (it was a 500).
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{_name(at)}: text with a lone surrogate (not UTF-8)") from None


def _check_scalar(value: object, at: _Path) -> None:
    if isinstance(value, str):
        _check_text(value, at)
        return
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        if not INT64[0] <= value <= INT64[1]:
            raise ValueError(f"{_name(at)}: integer does not fit in 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{_name(at)}: {value} is not a JSON number")
    else:
        raise ValueError(f"{_name(at)}: a {type(value).__name__} is not a JSON value")


def pydantic_detail(exc: ValidationError) -> list[dict[str, object]]:
    return [
        {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


def validate_spec(data: object) -> JobSpec:
    """One spec, as `POST /jobs` takes it (already parsed from JSON)."""
    if not isinstance(data, Mapping):
        raise InvalidInput("body must be a JSON object")
    try:
        spec = SubmitJob.model_validate(data).to_spec()
    except ValidationError as exc:
        raise InvalidInput(pydantic_detail(exc)) from None
    check_graph([spec], batch=False)
    return spec


def validate_batch(data: object) -> list[JobSpec]:
    """`{"jobs": [spec, ...]}`, all or nothing; an error's `loc` names the bad spec's index.
    Specs may depend on each other by `ref`: a ref used twice, or a cycle, is refused here;
    parents named by job id are checked against the store by the client core."""
    if not isinstance(data, Mapping):
        raise InvalidInput("body must be a JSON object")
    try:
        specs = [job.to_spec() for job in SubmitBatch.model_validate(data).jobs]
    except ValidationError as exc:
        raise InvalidInput(pydantic_detail(exc)) from None
    check_graph(specs, batch=True)
    return specs


def unknown_task(task: str, known: Collection[str]) -> str:
    names = ", ".join(sorted(known)) or "(none)"
    return f"unknown task {task!r}; known tasks: {names}"


def unknown_task_detail(
    specs: Sequence[JobSpec], unknown: Mapping[str, Collection[str]], *, batch: bool
) -> ErrorDetail:
    """The `422` for the first spec naming a task in `unknown` (task -> the names known)."""
    for index, spec in enumerate(specs):
        if spec.task in unknown:
            message = unknown_task(spec.task, unknown[spec.task])
            if not batch:
                return message
            return [{"loc": ["jobs", index, "task"], "msg": message, "type": "unknown_task"}]
    raise ValueError("no unknown task among these specs")
