"""A job's output stream (`ctx.emit`), without a database: what a chunk may hold, its size
caps, and the positions a reader resumes from.

A chunk is text (a `str`, stored and served as it is) or a JSON-encodable value (stored as
BSON, served as JSON). Each chunk of a job has a sequence number, per job, from 1: attempts
go on where the last one stopped, so the job's output is one ordered stream, every chunk
marked with the attempt that emitted it. A position is `"{attempt}-{seq}"`: a chunk's own,
or, for the start of an attempt's output, that attempt and the sequence number before its
first chunk.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import bson

from brook.common.domain.errors import OutputLimitExceeded

MAX_CHUNK_BYTES = 64 * 1024  # one chunk, as stored

Kind = Literal["text", "json"]

POSITION_PATTERN = r"^([0-9]{1,9})-([0-9]{1,12})$"
_POSITION = re.compile(POSITION_PATTERN)


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """One emitted chunk, as a worker hands it to the store."""

    seq: int
    kind: Kind
    data: Any
    size: int
    step: str | None = None
    emitted_at: float | None = None  # the worker's clock (time.time()): for latency figures


@dataclass(frozen=True, kw_only=True)
class OutputChunk:
    """One chunk of a job's output, as a reader gets it (`Client.output`): the attempt that
    emitted it, its sequence number in the job's stream, its kind (`text` or `json`), its
    value, and the step it was emitted in (None outside steps)."""

    attempt: int
    seq: int
    kind: Kind
    data: Any
    step: str | None = None

    @property
    def position(self) -> str:
        """`"{attempt}-{seq}"`: give it back as `after=` (or `Last-Event-ID`) to resume
        right after this chunk."""
        return format_position(self.attempt, self.seq)

    @property
    def text(self) -> str:
        """The chunk as `?format=text` shows it: text as it is, a JSON value on a line."""
        return as_text(self.kind, self.data)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> OutputChunk:
        return cls(
            attempt=int(doc["attempt"]),
            seq=int(doc["seq"]),
            kind="text" if doc.get("kind") == "text" else "json",
            data=doc.get("data"),
            step=doc.get("step"),
        )


def encode_chunk(data: Any) -> tuple[Kind, Any, int]:
    """What `ctx.emit(data)` stores: its kind, its value (JSON's round trip for a value) and
    its size. `TypeError` for what is neither text nor JSON, `OutputLimitExceeded` for a
    chunk over MAX_CHUNK_BYTES."""
    if isinstance(data, str):
        kind: Kind = "text"
        value: Any = data
        size = len(data.encode("utf-8", "surrogatepass"))
    else:
        try:
            text = json.dumps(data, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"ctx.emit takes text or a JSON-encodable value, not {type(data).__name__} ({exc})"
            ) from exc
        kind, value, size = "json", json.loads(text), len(text.encode())
        try:
            bson.encode({"v": value})
        except (bson.errors.InvalidDocument, OverflowError) as exc:
            raise TypeError(f"ctx.emit: this value cannot be stored ({exc})") from exc
    if size > MAX_CHUNK_BYTES:
        raise OutputLimitExceeded(
            f"an output chunk is {size} bytes; a chunk's limit is {MAX_CHUNK_BYTES}"
        )
    return kind, value, size


def check_job_total(chunks: int, size: int, max_chunks: int, max_bytes: int) -> None:
    """Past a job's cap, `emit` fails with this error (the chunk is not kept)."""
    if chunks > max_chunks:
        raise OutputLimitExceeded(
            f"the job's output would hold {chunks} chunks; the limit is {max_chunks} "
            "(BROOK_OUTPUT_MAX_CHUNKS)"
        )
    if size > max_bytes:
        raise OutputLimitExceeded(
            f"the job's output would hold {size} bytes; the limit is {max_bytes} "
            "(BROOK_OUTPUT_MAX_BYTES)"
        )


@dataclass(frozen=True, kw_only=True)
class Placed:
    """Where a batch of an attempt's chunks goes in its job's stream (`place`).

    `kept` False: the batch is not the next one of the job's stream, and nothing of it is
    written. Else its chunks after the first `skip` (found written already: the same batch
    again, after a write whose answer was lost) go from `first_seq` on. `moved` chunks
    (`moved_bytes` bytes) that an earlier attempt wrote past the job's count, which is
    where this attempt began numbering, come first: the batch goes on after them."""

    kept: bool
    first_seq: int = 0
    skip: int = 0
    moved: int = 0
    moved_bytes: int = 0


NOT_NEXT = Placed(kept=False)


def place(attempt: int, first: int, count: int, near: list[tuple[int, int, int]]) -> Placed:
    """Where `count` chunks of `attempt`, numbered from `first` by its worker, go; `near`
    holds `(seq, attempt, size)` of the job's chunks from `first - 1` on, in order.

    The chunk before the batch must be there (or the batch is the job's first): batches go
    in order. Chunks already at `first` and after are either this attempt's own, a prefix
    of the batch written before (skipped), or an earlier attempt's, written after the
    count this attempt started from (the batch is numbered after them). Never both."""
    if first > 1 and not any(seq == first - 1 for seq, _, _ in near):
        return NOT_NEXT
    tail = [(seq, a, size) for seq, a, size in near if seq >= first]
    if not tail:
        return Placed(kept=True, first_seq=first)
    expected = list(range(first, first + len(tail)))
    if [seq for seq, _, _ in tail] != expected:
        return NOT_NEXT  # a gap in the stream: never made by Brook's writes
    if all(a == attempt for _, a, _ in tail):
        if len(tail) > count:
            return NOT_NEXT
        return Placed(kept=True, first_seq=first + len(tail), skip=len(tail))
    if any(a >= attempt for _, a, _ in tail):
        return NOT_NEXT
    return Placed(
        kept=True,
        first_seq=first + len(tail),
        moved=len(tail),
        moved_bytes=sum(size for _, _, size in tail),
    )


def format_position(attempt: int, seq: int) -> str:
    return f"{attempt}-{seq}"


def parse_position(text: str) -> tuple[int, int] | None:
    """`(attempt, seq)` of a position's text; None for text that is no position."""
    found = _POSITION.fullmatch(text)
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2))


def as_text(kind: str, data: Any) -> str:
    """A chunk in `?format=text`: text as it is, a JSON value on a line of its own."""
    if kind == "text":
        return str(data)
    return json.dumps(data, separators=(",", ":")) + "\n"
