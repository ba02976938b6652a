"""Quotas: named limits shared by every queue and task that draws on them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path
from fastapi.responses import JSONResponse

from brook.common.domain.errors import QuotaNotFound
from brook.common.domain.quota_specs import QUOTA_NAME, QuotaUpdate
from brook.ingest.deps import Core, json_body
from brook.ingest.encoding import json_response

router = APIRouter(tags=["quotas"])

# The name's pattern is in the document: another gets FastAPI's `422` before the route runs.
Name = Annotated[str, Path(description="the quota's name", pattern=QUOTA_NAME)]
_SET_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": QuotaUpdate.model_json_schema()}},
    }
}


@router.get("/quotas")
async def list_quotas(core: Core) -> JSONResponse:
    """Every quota: its limits and state (`effective_rate`, `closed_until`, `debt`, what its
    windows hold, the attempts `running` under it)."""
    return json_response({"quotas": await core.quotas()})


@router.get("/quotas/{name:path}", responses={404: {"description": "no such quota"}})
async def get_quota(name: Name, core: Core) -> JSONResponse:
    """One quota: its limits, its state and its ledger (`totals`: units and requests per
    minute and per day, as a whole and by key)."""
    try:
        return json_response(await core.quota(name))
    except QuotaNotFound:
        raise HTTPException(404, f"no quota named {name!r}") from None


@router.put(
    "/quotas/{name:path}",
    openapi_extra=_SET_OPENAPI,
    responses={
        413: {"description": "body over the limit"},
        422: {"description": "nothing changed"},
    },
)
async def set_quota(
    name: Name, body: Annotated[object, Depends(json_body)], core: Core
) -> JSONResponse:
    """Set the quota's limits for the whole cluster: `units` and `requests` (`{"limit": n,
    "per_seconds": s}`), `concurrency` (jobs at once). `null` clears a limit; a field left
    out keeps its value; a quota keeps at least one. `422` (nothing changed) otherwise."""
    return json_response(await core.set_quota(name, body))


@router.delete("/quotas/{name:path}", responses={404: {"description": "no such quota"}})
async def delete_quota(name: Name, core: Core) -> JSONResponse:
    """Remove the quota (`{"deleted": name}`). Jobs that name it wait until it is set again."""
    try:
        await core.delete_quota(name)
    except QuotaNotFound:
        raise HTTPException(404, f"no quota named {name!r}") from None
    return json_response({"deleted": name})
