"""Who may ask: the bearer tokens. `BROOK_API_TOKEN` (admin: everything) and
`BROOK_API_READ_TOKEN` (read: safe methods only), compared in constant time; with no token
set, every request is admin. Which `Host` and `Origin` the API answers to is the front
door's (`brook.ingest.guard`)."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request

from brook.common.runtime.log_events import requested_by
from brook.ingest.deps import State
from brook.ingest.guard import SAFE_METHODS
from brook.ingest.state import ApiState

ADMIN = "admin"
READ = "read"
NO_TOKEN = "none"


def _bearer(request: Request) -> bytes | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip().encode()


def access_of(request: Request, state: ApiState) -> str | None:
    """`admin` or `read` (which token the request carries), or None (no valid one). With no
    token set, every request is `admin`."""
    settings = state.settings
    if settings.api_token is None:
        return ADMIN
    given = _bearer(request)
    if given is None:
        return None
    # Both compared every time (constant time, whichever matches).
    admin = hmac.compare_digest(given, settings.api_token.get_secret_value().encode())
    read = settings.api_read_token is not None and hmac.compare_digest(
        given, settings.api_read_token.get_secret_value().encode()
    )
    return ADMIN if admin else READ if read else None


async def require_token(request: Request, state: State) -> None:
    """With `BROOK_API_TOKEN` set, demand `Authorization: Bearer <token>` (`401`); a
    read-only token (`BROOK_API_READ_TOKEN`) may only read (`403` for a state change).
    The state changes a request asks for are logged with `by` its token's name (`none`
    with no token set)."""
    access = access_of(request, state)
    if access is None:
        raise HTTPException(
            401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
        )
    if access == READ and request.method not in SAFE_METHODS:
        raise HTTPException(403, "this token may only read")
    request.state.access = access
    # Who asked, in the audit lines: the token's name, or `none` with tokens off.
    requested_by.set(access if state.settings.api_token is not None else NO_TOKEN)
