"""Documents an application may hold that Brook must get past: a date no `datetime` holds,
a string that is not UTF-8, a document nested almost as deep as MongoDB allows."""

from __future__ import annotations

from typing import Any

import bson
from bson import DatetimeMS
from bson.raw_bson import RawBSONDocument

YEAR_10000 = DatetimeMS(253402300800000)  # 10000-01-01: no `datetime` holds it


def nested(depth: int) -> dict[str, Any]:
    """A document `depth` levels deep."""
    doc: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        doc = {"a": doc}
    return doc


def not_utf8(doc_id: str) -> RawBSONDocument:
    """A paid order whose name is not UTF-8: MongoDB stores it as it is given (another
    driver, a byte slice), and the Python driver cannot decode it."""
    raw = bson.encode({"_id": doc_id, "status": "paid", "name": "abc"})
    return RawBSONDocument(raw.replace(b"abc", b"a\xffc"))
