"""FastAPI dependencies: the typed state, the bearer-token check, and the submit bodies."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from common.domain.models import JobSpec
from common.operations.client_core import ClientCore
from common.store.jobs import JobStore
from ingest.state import ApiState
from ingest.validation import judge, load_body, parse_batch, parse_submit

# Dependencies are `async def`: FastAPI runs plain `def` ones in a thread pool.


async def get_state(request: Request) -> ApiState:
    state = request.app.state.brook
    if not isinstance(state, ApiState):
        raise RuntimeError("the API's state is missing: was the app started with its lifespan?")
    return state


State = Annotated[ApiState, Depends(get_state)]


async def get_store(state: State) -> JobStore:
    return state.store


async def get_core(state: State) -> ClientCore:
    return state.core


Store = Annotated[JobStore, Depends(get_store)]
Core = Annotated[ClientCore, Depends(get_core)]


async def require_token(request: Request, state: State) -> None:
    """With `BROOK_API_TOKEN` set, demand `Authorization: Bearer <token>`; else let all in."""
    secret = state.settings.api_token
    if secret is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    expected = secret.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise HTTPException(
            401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
        )


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it is known to exceed `limit` bytes (declared or read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def _limited_body(request: Request, state: ApiState) -> bytes:
    limit = state.settings.max_body_bytes
    try:
        return await read_body(request, limit)
    except BodyTooLarge:
        raise HTTPException(413, f"body larger than {limit} bytes") from None


async def submit_body(request: Request, state: State) -> JobSpec:
    """A valid `POST /jobs` body: `413` if too large, else `422` (`InvalidInput`)."""
    return await judge(parse_submit, await _limited_body(request, state))


async def json_body(request: Request, state: State) -> object:
    """Any JSON body within the size limit: `413` if too large, `422` if not JSON; what it
    must hold is for the route to check."""
    return await judge(load_body, await _limited_body(request, state))


async def batch_body(request: Request, state: State) -> list[JobSpec]:
    """A valid `POST /jobs/batch` body: `413` if too large, else `422` naming the bad spec."""
    return await judge(parse_batch, await _limited_body(request, state))
