"""The one way the API turns Brook's documents into JSON: responses, and event streams' data.

`json.dumps` with a `default` for the few non-JSON types a job holds: FastAPI's
`jsonable_encoder` walks every value in Python first, which costs ~0.2 ms a job, most of a
1,000-job batch's response.

The shapes (docs/http-api.md, "Values only BSON can hold"): MongoDB's relaxed extended
JSON, as `bson.json_util` writes it, for every value JSON cannot hold (a `Decimal128` is
`{"$numberDecimal": "1.5"}`, a `Regex` `{"$regularExpression": {...}}`, binary data
`{"$binary": {...}}`, a NaN `{"$numberDouble": "NaN"}`, ...), but for three types whose
shape the API has always had, wherever they are: a datetime is an ISO-8601 string, an
`ObjectId` its 24 hex digits, a UUID its canonical string. So a date a Python `datetime`
cannot hold (year 0 or 10000: a `DatetimeMS`) is `{"$date": {"$numberLong": "<ms>"}}`,
and the `$id` of a `DBRef` is a plain string when it is an `ObjectId`. JavaScript `Code`
is its text: PyMongo's `Code` is a `str`, which `json` writes as a string before any hook
sees it, and only a walk of every value in Python (what this module avoids) could tell it
apart.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Collection
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from bson import (
    DBRef,
    Decimal128,
    MaxKey,
    MinKey,
    ObjectId,
    Regex,
    Timestamp,
    json_util,
)
from bson.codec_options import CodecOptions
from bson.datetime_ms import DatetimeMS
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from brook.common.domain.models import Job

# Values whose extended JSON `json_util` writes whole (none holds another value).
_EXTENDED = (Regex, re.Pattern, Timestamp, MinKey, MaxKey, Decimal128, bytes)  # Binary: bytes
_RELAXED = json_util.RELAXED_JSON_OPTIONS
_UTC: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=True, tzinfo=UTC)
# The dates a `datetime` holds (years 1 to 9999), in ms since the epoch.
_MIN_MS = int(datetime(1, 1, 1, tzinfo=UTC).timestamp()) * 1000
_MAX_MS = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()) * 1000 + 999


def _default(value: object) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, ObjectId | uuid.UUID | Decimal):
        return str(value)
    if isinstance(value, _EXTENDED):
        return json_util.default(value, _RELAXED)
    if isinstance(value, DatetimeMS):  # decoded so only out of `datetime`'s range
        ms = int(value)
        if _MIN_MS <= ms <= _MAX_MS:
            return value.as_datetime(_UTC).isoformat()
        return {"$date": {"$numberLong": str(ms)}}
    if isinstance(value, DBRef):  # holds other values: each is written by these same rules
        return dict(value.as_doc())
    return jsonable_encoder(value)  # anything rarer: FastAPI's rules


def _finite(value: Any) -> Any:
    """`value` with each NaN or infinity (a BSON double JSON cannot hold) as extended JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return json_util.default(value, _RELAXED)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, DBRef):
        return _finite(dict(value.as_doc()))
    return value


def _dumps(content: object) -> str:
    return json.dumps(
        content, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_default
    )


def dumps(content: object) -> str:
    """`content` as compact JSON text, the way every response of the API encodes it."""
    try:
        return _dumps(content)
    except ValueError:
        # A NaN or an infinity: rare (only a document written around the API holds one),
        # so only then is the whole value walked in Python.
        return _dumps(_finite(content))


class _JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")


def json_response(
    content: object, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    """`content` (datetimes, ObjectIds and the other BSON values included) as a JSON
    response."""
    return _JSON(content, status_code=status_code, headers=headers)


def job_response(
    job: Job, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    return json_response(job.to_api(), status_code, headers)


def job_text(job: Job, *, leave_out: Collection[str] = ()) -> str:
    """The job as the JSON text of `GET /jobs/{id}` (an event stream's `data:`), without
    the fields named in `leave_out`."""
    doc = job.to_api()
    for name in leave_out:
        doc.pop(name, None)
    return dumps(doc)
