"""The one way the API turns Brook's documents into JSON responses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bson import ObjectId
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from common.models import Job

# BSON values a stored payload or result may hold that JSON has no type for.
# Typed as `jsonable_encoder` declares its `custom_encoder`.
_BSON_ENCODERS: dict[Any, Callable[[Any], Any]] = {
    ObjectId: str,
    bytes: lambda b: b.hex(),
}


def json_response(
    content: object, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    """`content` (datetimes, ObjectIds and bytes included) as a JSON response."""
    return JSONResponse(
        jsonable_encoder(content, custom_encoder=_BSON_ENCODERS),
        status_code=status_code,
        headers=headers,
    )


def job_response(
    job: Job, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    return json_response(job.to_api(), status_code, headers)
