"""FastAPI dependencies: the typed state and the submit bodies (the bearer-token check is
`brook.ingest.auth`'s)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from brook.common.client.core import ClientCore
from brook.common.domain.errors import InvalidInput
from brook.common.domain.models import JobSpec
from brook.common.store.jobs import JobStore
from brook.ingest.state import ApiState
from brook.ingest.validation import judge, load_body, parse_batch, parse_submit

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


def _check_retention(specs: list[JobSpec], most_s: float, *, batch: bool) -> None:
    """A client may ask to keep its jobs longer than the default, up to what the operator
    allows (`BROOK_RETENTION_MAX_SECONDS`): beyond it, `422`."""
    for index, spec in enumerate(specs):
        if spec.retention_s is not None and spec.retention_s > most_s:
            loc: list[str | int] = ["jobs", index, "retention_s"] if batch else ["retention_s"]
            msg = f"at most {most_s:g} seconds here (BROOK_RETENTION_MAX_SECONDS)"
            raise InvalidInput([{"loc": loc, "msg": msg, "type": "less_than_equal"}])


async def submit_body(request: Request, state: State) -> JobSpec:
    """A valid `POST /jobs` body: `413` if too large, else `422` (`InvalidInput`)."""
    spec = await judge(parse_submit, await _limited_body(request, state))
    _check_retention([spec], state.settings.retention_max_seconds, batch=False)
    return spec


async def optional_json_body(request: Request, state: State) -> object:
    """`json_body`, where no body at all reads as `{}`."""
    raw = await _limited_body(request, state)
    return {} if not raw.strip() else await judge(load_body, raw)


async def json_body(request: Request, state: State) -> object:
    """Any JSON body within the size limit: `413` if too large, `422` if not JSON; what it
    must hold is for the route to check."""
    return await judge(load_body, await _limited_body(request, state))


async def batch_body(request: Request, state: State) -> list[JobSpec]:
    """A valid `POST /jobs/batch` body: `413` if too large, else `422` naming the bad spec."""
    specs = await judge(parse_batch, await _limited_body(request, state))
    _check_retention(specs, state.settings.retention_max_seconds, batch=True)
    return specs
