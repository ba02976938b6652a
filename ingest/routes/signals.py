"""Signals: `POST /signals/{key}` wakes the jobs waiting on `key` (`ctx.wait_for_signal`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse

from brook.common.domain.errors import InvalidInput
from brook.common.domain.steps import SIGNAL_KEY, SIGNAL_KEY_RULE
from brook.common.domain.validation import PAYLOAD_DEFS
from brook.ingest.deps import Core, optional_json_body
from brook.ingest.encoding import json_response

router = APIRouter(tags=["signals"])

# Any key reaches the validator, so a bad one gets the same `422` as from the client.
# The document states the pattern the validator holds keys to.
Key = Annotated[
    str,
    Path(
        description=f"the signal's key: {SIGNAL_KEY_RULE}",
        max_length=1000,
        json_schema_extra={"pattern": SIGNAL_KEY.pattern},
    ),
]
_SIGNAL_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": False,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "payload": {"$ref": "#/$defs/PayloadValue", "description": "any JSON value"}
                    },
                    "additionalProperties": False,
                    "$defs": PAYLOAD_DEFS,
                }
            }
        },
    }
}


@router.post(
    "/signals/{key}",
    openapi_extra=_SIGNAL_OPENAPI,
    responses={
        413: {"description": "body over the limit"},
        422: {"description": "a bad key, body or payload; nothing stored"},
    },
)
async def send_signal(
    key: Key, body: Annotated[object, Depends(optional_json_body)], core: Core
) -> JSONResponse:
    """Send a signal on `key` with body `{"payload": <any JSON>}` (an empty object: a null
    payload). It is stored durably and kept for `BROOK_SIGNAL_RETENTION_SECONDS`; every job
    waiting on `key` is woken (through the dispatchers' change stream); a wait that starts
    later within the retention returns it at once. Answers `{"woken": N}`, the jobs woken."""
    if not isinstance(body, dict) or set(body) - {"payload"}:
        raise InvalidInput('the body must be {"payload": <any JSON>}')
    woken = await core.signal(key, body.get("payload"))
    return json_response({"woken": woken})
