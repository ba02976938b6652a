"""The one way the API turns Brook's documents into JSON responses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bson import ObjectId
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from common.models import Doc, Job

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


# Fields a newer Brook may store on a job before this version's `Job` knows them (`queue`,
# `progress`): event streams pass them on as stored, so watchers see them.
PASS_THROUGH = ("queue", "progress")


def jsonable(content: object) -> Any:
    """`content` as plain JSON types (datetimes as ISO-8601, ObjectIds and bytes as text)."""
    return jsonable_encoder(content, custom_encoder=_BSON_ENCODERS)


def job_json(doc: Doc) -> dict[str, Any]:
    """A stored job document as the API's job JSON, plus the fields passed through."""
    job = Job.from_doc(doc).to_api()
    for key in PASS_THROUGH:
        if key in doc and key not in job:
            job[key] = doc[key]
    out: dict[str, Any] = jsonable(job)
    return out
