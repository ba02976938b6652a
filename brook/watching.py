"""The CLI's view of the API's event streams: `brook watch` and `brook submit --wait`.

Both follow a server-sent event stream (never polling); when the connection is cut (the
API restarted, say) they reconnect with `Last-Event-ID` and miss nothing. (`--wait` shows
what it follows through `brook.job_view`.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError

from common.settings import Settings

JsonObject = dict[str, Any]
OnEvent = Callable[[str, JsonObject], bool]  # (kind, data) → True to stop following

RECONNECT_S = 1.0
GIVE_UP_S = 60.0  # no answer from the API for this long: stop trying
READ_TIMEOUT_S = 75.0  # several missed heartbeats: the connection is dead, reconnect
TERMINAL = ("completed", "failed", "cancelled")


class StreamFailed(Exception):
    """The API refused the stream (the message is its `detail`), or could not be reached."""


class _Unavailable(Exception):
    """A `503`: worth another try, for a while."""


def base_url(settings: Settings) -> str:
    host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::") else settings.api_host
    return f"http://{host}:{settings.api_port}"


def auth_headers(settings: Settings) -> dict[str, str]:
    if settings.api_token is None:
        return {}
    return {"Authorization": f"Bearer {settings.api_token.get_secret_value()}"}


def _refusal(resp: httpx.Response) -> str:
    resp.read()
    try:
        detail = resp.json().get("detail")
    except ValueError:
        detail = resp.text
    return f"{resp.status_code} {detail if isinstance(detail, str) else json.dumps(detail)}"


def follow(
    settings: Settings,
    path: str,
    on_event: OnEvent,
    *,
    params: dict[str, str] | None = None,
    deadline: float = float("inf"),
) -> bool:
    """Follow the stream at `path` until `on_event` says stop (True), the stream is over
    (204: True), or `deadline` (monotonic) passes (False). Cuts are resumed."""
    last_id: str | None = None
    down_since: float | None = None
    while time.monotonic() < deadline:
        headers = {"Accept": "text/event-stream", **auth_headers(settings)}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        read = min(READ_TIMEOUT_S, max(deadline - time.monotonic(), 0.1))
        try:
            with httpx.stream(
                "GET",
                base_url(settings) + path,
                params=params,
                headers=headers,
                timeout=httpx.Timeout(10.0, read=read),
            ) as resp:
                if resp.status_code == 204:
                    return True
                if resp.status_code == 503:  # no primary for now (a failover): try again
                    raise _Unavailable(_refusal(resp))
                if resp.status_code >= 400:
                    raise StreamFailed(_refusal(resp))
                down_since = None
                for sse in EventSource(resp).iter_sse():
                    last_id = sse.id or last_id
                    if sse.event in ("job", "reset") and on_event(sse.event, json.loads(sse.data)):
                        return True
        except (httpx.HTTPError, SSEError, _Unavailable) as exc:
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since > GIVE_UP_S:
                why = str(exc) if isinstance(exc, _Unavailable) else exc.__class__.__name__
                where = base_url(settings) + path
                raise StreamFailed(f"cannot follow {where} ({why})") from None
        time.sleep(RECONNECT_S)
    return False


# -- rendering -----------------------------------------------------------------------------------


def event_line(job: JsonObject) -> str:
    """One human line per event: when, which job, its state, and its progress if any."""
    at = job.get("finished_at") or job.get("started_at") or job.get("created_at") or ""
    line = (
        f"{str(at)[:23]:<23}  {job['id']}  {job['status']:<9}  {job['task']:<12}  "
        f"attempt {job['attempts']}/{job['max_attempts']}"
    )
    progress = job.get("progress")
    if isinstance(progress, dict) and job["status"] == "running":
        line += f"  {_pct(progress)}"
        if progress.get("message"):
            line += f" {progress['message']}"
    error = job.get("error")
    if job["status"] in ("failed", "cancelled") and isinstance(error, dict):
        line += f"  {error.get('type')}: {error.get('message')}"
    return line


def _pct(progress: JsonObject) -> str:
    fraction = progress.get("fraction")
    return f"{float(fraction) * 100:.0f}%" if isinstance(fraction, int | float) else "?"
