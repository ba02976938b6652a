"""How the API writes a job's values as JSON: what JSON holds as it is, BSON's own values
as MongoDB's relaxed extended JSON, and the shapes the API always had kept."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from bson import (
    DBRef,
    Decimal128,
    Int64,
    MaxKey,
    MinKey,
    ObjectId,
    Regex,
    Timestamp,
    json_util,
)
from bson.binary import Binary
from bson.code import Code
from bson.codec_options import DatetimeConversion
from bson.datetime_ms import DatetimeMS
from fastapi import HTTPException

from brook.ingest.encoding import dumps
from brook.ingest.fields import parse_include

OID = ObjectId("65f000000000000000000001")
WHEN = datetime(2026, 3, 1, 12, 30, 45, 123000, tzinfo=UTC)

# Each value only BSON can hold, and the extended JSON the API writes for it.
BSON_ONLY: dict[str, tuple[Any, Any]] = {
    "dbref": (
        DBRef("orders", OID, "shop", note="x"),
        {"$ref": "orders", "$id": str(OID), "$db": "shop", "note": "x"},
    ),
    "regex": (Regex("^a.c$", "im"), {"$regularExpression": {"pattern": "^a.c$", "options": "im"}}),
    "pattern": (
        re.compile("^a", re.IGNORECASE),
        {"$regularExpression": {"pattern": "^a", "options": "iu"}},
    ),
    "timestamp": (Timestamp(1_700_000_000, 7), {"$timestamp": {"t": 1_700_000_000, "i": 7}}),
    "min_key": (MinKey(), {"$minKey": 1}),
    "max_key": (MaxKey(), {"$maxKey": 1}),
    "decimal": (Decimal128("1234.5678"), {"$numberDecimal": "1234.5678"}),
    "decimal_nan": (Decimal128("NaN"), {"$numberDecimal": "NaN"}),
    "bytes": (b"\x00\xff", {"$binary": {"base64": "AP8=", "subType": "00"}}),
    "binary": (Binary(b"\x01", 5), {"$binary": {"base64": "AQ==", "subType": "05"}}),
    "year_10000": (DatetimeMS(253402300800000), {"$date": {"$numberLong": "253402300800000"}}),
    "year_0": (DatetimeMS(-62135596800001), {"$date": {"$numberLong": "-62135596800001"}}),
    "nan": (float("nan"), {"$numberDouble": "NaN"}),
    "infinity": (float("-inf"), {"$numberDouble": "-Infinity"}),
}


def test_values_only_bson_can_hold_are_written_as_relaxed_extended_json() -> None:
    doc = {name: value for name, (value, _) in BSON_ONLY.items()}
    written = json.loads(dumps({"payload": doc, "list": list(doc.values())}))
    assert written["payload"] == {name: shape for name, (_, shape) in BSON_ONLY.items()}
    assert written["list"] == [shape for _, shape in BSON_ONLY.values()]


@pytest.mark.parametrize(
    "name", ["regex", "timestamp", "min_key", "max_key", "decimal", "bytes", "binary", "year_10000"]
)
def test_extended_json_reads_back_as_the_same_bson_value(name: str) -> None:
    value, _ = BSON_ONLY[name]
    options = json_util.RELAXED_JSON_OPTIONS.with_options(
        datetime_conversion=DatetimeConversion.DATETIME_AUTO
    )
    back = json_util.loads(dumps({"v": value}), json_options=options)["v"]
    assert back == value


def test_the_shapes_the_api_always_wrote_are_kept_wherever_they_are() -> None:
    key = uuid.UUID("12345678-1234-5678-1234-567812345678")
    doc = {
        "at": WHEN,
        "id": OID,
        "uuid": key,
        "n": Int64(2**40),
        "x": 1.5,
        "code": Code("return 1"),
        "in_range": DatetimeMS(1_000),
        "ref": DBRef("c", WHEN),
    }
    assert json.loads(dumps(doc)) == {
        "at": "2026-03-01T12:30:45.123000+00:00",
        "id": "65f000000000000000000001",
        "uuid": "12345678-1234-5678-1234-567812345678",
        "n": 2**40,
        "x": 1.5,
        "code": "return 1",  # PyMongo's `Code` is a `str`: its text
        "in_range": "1970-01-01T00:00:01+00:00",
        "ref": {"$ref": "c", "$id": "2026-03-01T12:30:45.123000+00:00"},
    }


def test_a_nan_inside_a_dbref_or_deep_in_a_list_is_written_too() -> None:
    doc = {"a": [[{"b": float("inf")}]], "r": DBRef("c", float("nan"))}
    assert json.loads(dumps(doc)) == {
        "a": [[{"b": {"$numberDouble": "Infinity"}}]],
        "r": {"$ref": "c", "$id": {"$numberDouble": "NaN"}},
    }


def test_include_names_payload_result_or_both_and_nothing_else() -> None:
    assert parse_include(None) == frozenset() == parse_include("")
    assert parse_include("payload") == {"payload"}
    assert parse_include(" result , payload,") == {"payload", "result"}
    with pytest.raises(HTTPException) as refused:
        parse_include("payload,history")
    assert refused.value.status_code == 400
    assert refused.value.detail == "include: unknown field 'history'; known: payload, result"
