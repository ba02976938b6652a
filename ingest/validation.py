"""The HTTP edge of validation: a raw body to job specs. What a spec may hold is decided in
`brook.common.domain.validation`, which the Python client uses too, so both reject the same inputs
with the same detail.

Every step costs time linear in the body, whatever it holds: the depth is counted with a
few passes of C-level byte operations (no regular expression that can backtrack), the JSON
parser is CPython's (linear, its recursion bounded), and the validators walk the parsed
value once. A large body is judged off the event loop (`judge`), in chunks small enough
that the loop's thread gets the interpreter back every few milliseconds, so one hostile
request cannot stall `/healthz` or the event streams.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import operator
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from brook.common.domain.errors import InvalidInput
from brook.common.domain.models import JobSpec
from brook.common.domain.validation import MAX_DEPTH, check_document, validate_batch, validate_spec

__all__ = [
    "InvalidInput",
    "body_depth",
    "check_document",
    "judge",
    "load_body",
    "parse_batch",
    "parse_submit",
]

# Deeper bodies are refused before parsing (a deep body must not make the parser recurse).
# Shallower ones are parsed and judged by the shared validator, whose message for a too
# deep payload is the one the Python client gives.
MAX_BODY_DEPTH = 4 * MAX_DEPTH
# Values in one body, at most (counted by its commas, before parsing): what bounds the time
# the parser and the validators spend on one body, whatever the size limit.
MAX_BODY_VALUES = 100_000
# Bodies up to this size are judged inline (well under a millisecond); larger ones in a
# worker thread, so the event loop keeps serving other clients meanwhile.
INLINE_BYTES = 64 * 1024
PARSE_THREADS = 2  # bodies judged at once, per process: the rest wait their turn
_CHUNK = 64 * 1024  # brackets counted per step (a few milliseconds at most)

_OPENERS = b"[{"
_CLOSERS = b"]}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _OPENERS + _CLOSERS)
# `[` and `{` -> 2, `]` and `}` -> 0: minus one, each is a step of the depth.
_STEPS = bytes.maketrans(_OPENERS + _CLOSERS, b"\x02\x02\x00\x00")

T = TypeVar("T")
_pool = ThreadPoolExecutor(max_workers=PARSE_THREADS, thread_name_prefix="brook-body")


def _outside_strings(raw: bytes) -> bytes:
    """The bytes of `raw` outside its JSON strings (unterminated ones included), linearly.

    Escaped backslashes go first, then escaped quotes: what remains of a run of
    backslashes is at most one, so no new escape is formed, and every quote left ends or
    starts a string. Then the text between quotes alternates outside, inside, outside.
    """
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[0::2])


def body_depth(raw: bytes) -> int:
    """Nesting depth of a JSON text, counted without parsing (so a deep body cannot recurse)
    and in time linear in its length (a C-level pass per step, chunk by chunk)."""
    return _depth(_outside_strings(raw))


def _depth(outside: bytes) -> int:
    steps = outside.translate(None, _NOT_BRACKETS).translate(_STEPS)
    depth = deepest = 0
    for start in range(0, len(steps), _CHUNK):
        chunk = steps[start : start + _CHUNK]
        levels = itertools.accumulate(map(operator.sub, chunk, itertools.repeat(1)), initial=depth)
        deepest = max(deepest, max(levels))
        if deepest > MAX_BODY_DEPTH:
            break  # refused whatever follows
        depth += 2 * chunk.count(2) - len(chunk)
    return deepest


def _load(raw: bytes) -> object:
    outside = _outside_strings(raw)
    if outside.count(b",") >= MAX_BODY_VALUES:
        raise InvalidInput(f"body: more than {MAX_BODY_VALUES} values")
    if _depth(outside) > MAX_BODY_DEPTH:
        raise InvalidInput(f"body: nesting deeper than {MAX_DEPTH}")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # ValueError includes an integer of over 4,300 digits (CPython's own limit).
        raise InvalidInput(f"body is not valid JSON: {str(exc)[:200]}") from None


def load_body(raw: bytes) -> object:
    """Any JSON body, parsed with the same guards (`422` for a bad one)."""
    return _load(raw)


def parse_submit(raw: bytes) -> JobSpec:
    """The body of `POST /jobs`."""
    return validate_spec(_load(raw))


def parse_batch(raw: bytes) -> list[JobSpec]:
    """The body of `POST /jobs/batch`."""
    return validate_batch(_load(raw))


async def judge(parse: Callable[[bytes], T], raw: bytes) -> T:
    """`parse(raw)`: inline for a small body, else in one of `PARSE_THREADS` threads."""
    if len(raw) <= INLINE_BYTES:
        return parse(raw)
    return await asyncio.get_running_loop().run_in_executor(_pool, parse, raw)
