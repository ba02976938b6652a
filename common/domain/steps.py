"""Durable steps, sleeps and signal waits: their names and their size caps, without a
database (the worker checks them, the store records them, the API shows them); their errors
are with the others, in `brook.common.domain.errors`.

A step's result is stored in its job's document (`steps`), so it must encode to BSON and
fit the caps below: a job document also holds its payload and its result, and MongoDB
caps a document at 16 MiB.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import bson

from brook.common.domain.errors import StepError

MAX_STEP_BYTES = 1024 * 1024  # one step's result, as BSON
MAX_STEPS_BYTES = 4 * 1024 * 1024  # every step of a job together
MAX_STEP_NAME = 200
MAX_SIGNAL_PAYLOAD_BYTES = 256 * 1024
SIGNAL_KEY = re.compile(r"^[A-Za-z0-9_.:@=+-]{1,200}$")
SIGNAL_KEY_RULE = "1 to 200 characters among letters, digits and _ . : @ = + -"
CHANGED = "changed#"  # the start of the name of a `ctx.changed` marker


def check_step_name(name: object) -> str:
    """A step name: a non-empty string of at most MAX_STEP_NAME characters, without `#`
    (Brook names the steps of `ctx.sleep` and `ctx.wait_for_signal` with one)."""
    if not isinstance(name, str) or not name:
        raise StepError(f"a step name must be a non-empty string, not {name!r}")
    if len(name) > MAX_STEP_NAME:
        raise StepError(f"step name {name[:40]!r}... is longer than {MAX_STEP_NAME} characters")
    if "#" in name:
        raise StepError(f"step name {name!r} contains '#', which Brook keeps for its own steps")
    return name


def change_marker(change_id: object) -> str:
    """The step that records `ctx.changed(change_id)`'s answer: `changed#ID` (no step of a
    user's can be named so). An id is a step name: 1 to MAX_STEP_NAME characters, no `#`."""
    if not isinstance(change_id, str) or not change_id:
        raise StepError(f"a change id must be a non-empty string, not {change_id!r}")
    if len(change_id) > MAX_STEP_NAME or "#" in change_id:
        raise StepError(
            f"change id {change_id[:40]!r} must be at most {MAX_STEP_NAME} characters, without '#'"
        )
    return f"{CHANGED}{change_id}"


def encode_step_result(name: str, value: Any) -> tuple[Any, int]:
    """The result as it will be stored and replayed (BSON's round trip: a tuple comes back
    a list), and its size; a `StepError` naming the step if it cannot be stored."""
    try:
        raw = bson.encode({"v": value})
    except (bson.errors.InvalidDocument, OverflowError, TypeError, ValueError) as exc:
        raise StepError(
            f"step {name!r}: its result cannot be stored as BSON ({type(exc).__name__}: {exc})"
        ) from exc
    if len(raw) > MAX_STEP_BYTES:
        raise StepError(
            f"step {name!r}: its result is {len(raw)} bytes as BSON; a step's limit is "
            f"{MAX_STEP_BYTES}"
        )
    return bson.decode(raw)["v"], len(raw)


def check_steps_total(name: str, total: int) -> None:
    if total > MAX_STEPS_BYTES:
        raise StepError(
            f"step {name!r}: the job's steps would hold {total} bytes; the limit for all the "
            f"steps of a job is {MAX_STEPS_BYTES}"
        )


def seconds_of(duration: float | timedelta, what: str = "sleep") -> float:
    """A duration in seconds: a non-negative number or a `timedelta`."""
    if isinstance(duration, timedelta):
        seconds = duration.total_seconds()
    elif isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise TypeError(f"{what} takes seconds or a timedelta, not {type(duration).__name__}")
    else:
        seconds = float(duration)
    if not seconds >= 0:
        raise ValueError(f"{what} needs a duration of 0 or more seconds, not {duration!r}")
    return seconds


def check_signal_key(key: object) -> str:
    if not isinstance(key, str) or not SIGNAL_KEY.fullmatch(key):
        raise StepError(f"signal key {key!r} is invalid: {SIGNAL_KEY_RULE}")
    return key


def check_signal_payload(payload: Any) -> int:
    """The payload's size as BSON, if it may be sent."""
    try:
        size = len(bson.encode({"payload": payload}))
    except (bson.errors.InvalidDocument, OverflowError, TypeError, ValueError) as exc:
        raise StepError(f"signal payload cannot be stored as BSON: {exc}") from exc
    if size > MAX_SIGNAL_PAYLOAD_BYTES:
        raise StepError(
            f"signal payload is {size} bytes as BSON; the limit is {MAX_SIGNAL_PAYLOAD_BYTES}"
        )
    return size


def step_view(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded step as the API shows it: everything but its result."""
    return {k: v for k, v in entry.items() if k != "result"}
