"""The HTTP edge of validation: a raw body to job specs. What a spec may hold is decided in
`common.domain.validation`, which the Python client uses too, so both reject the same inputs
with the same detail."""

from __future__ import annotations

import itertools
import json
import re

from common.domain.errors import InvalidInput
from common.domain.models import JobSpec
from common.domain.validation import MAX_DEPTH, check_document, validate_batch, validate_spec

__all__ = [
    "InvalidInput",
    "body_depth",
    "check_document",
    "load_body",
    "parse_batch",
    "parse_submit",
]

# Deeper bodies are refused before parsing (a deep body must not make the parser recurse).
# Shallower ones are parsed and judged by the shared validator, whose message for a too
# deep payload is the one the Python client gives.
MAX_BODY_DEPTH = 4 * MAX_DEPTH
_STRING = re.compile(rb'"(?:\\.|[^"\\])*"')
_BRACKET = re.compile(rb"[\[\]{}]")


def body_depth(raw: bytes) -> int:
    """Nesting depth of a JSON text, counted without parsing (so a deep body cannot recurse)."""
    stripped = _STRING.sub(b'""', raw)
    steps = (1 if b in (b"[", b"{") else -1 for b in _BRACKET.findall(stripped))
    return max(itertools.accumulate(steps, initial=0))


def _load(raw: bytes) -> object:
    if body_depth(raw) > MAX_BODY_DEPTH:
        raise InvalidInput(f"body: nesting deeper than {MAX_DEPTH}")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput(f"body is not valid JSON: {exc}") from None


def load_body(raw: bytes) -> object:
    """Any JSON body, parsed with the same guards (`422` for a bad one)."""
    return _load(raw)


def parse_submit(raw: bytes) -> JobSpec:
    """The body of `POST /jobs`."""
    return validate_spec(_load(raw))


def parse_batch(raw: bytes) -> list[JobSpec]:
    """The body of `POST /jobs/batch`."""
    return validate_batch(_load(raw))
