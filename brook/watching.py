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

from brook.common.runtime.settings import Settings
from brook.terminal import safe

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
    kinds: tuple[str, ...] = ("job", "reset"),
    last_id: str | None = None,
) -> bool:
    """Follow the stream at `path` until `on_event` says stop (True), the stream is over
    (204: True), or `deadline` (monotonic) passes (False). Cuts are resumed. `on_event`
    hears the events of `kinds`; `last_id` starts it after that event."""
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
                    if sse.event in kinds and on_event(sse.event, json.loads(sse.data)):
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
    """One human line per event: when, which job, its state, and what this change was: while
    it runs, `claimed`, `started`, its progress or `cancel requested`; back to pending for
    another attempt, the error that ended the last one; at its end, its error if any. Safe
    to print: what the job carries cannot reach the terminal as control sequences."""
    return safe(_event_line(job))


def _event_line(job: JsonObject) -> str:
    line = (
        f"{_when(job)[:23]:<23}  {job['id']}  {job['status']:<9}  {job['task']:<12}  "
        f"attempt {job['attempts']}/{job['max_attempts']}"
    )
    if job["status"] == "running":
        line += f"  {_running(job)}"
    error = job.get("error")
    if isinstance(error, dict):
        if job["status"] in ("failed", "cancelled"):
            line += f"  {error.get('type')}: {error.get('message')}"
        elif job["status"] == "pending" and job["attempts"] > 0:
            line += f"  retry after {error.get('type')}: {error.get('message')}"
    return line


def _when(job: JsonObject) -> str:
    """The latest moment the job records: its last state change (a claim is one), its
    task's start, its last progress report, or its end. The API writes them all as ISO
    8601 in UTC with the same precision, so the greatest string is the latest time."""
    history = job.get("history")
    progress = job.get("progress")
    times = [
        history[-1].get("at") if isinstance(history, list) and history else None,
        job.get("started_at"),
        progress.get("at") if isinstance(progress, dict) else None,
        job.get("finished_at"),
    ]
    return max((t for t in times if isinstance(t, str)), default=str(job.get("created_at") or ""))


def _running(job: JsonObject) -> str:
    """A running job is claimed first (leased, not started yet), then started in a worker,
    then reports progress; a cancel request is noted on whichever of these it is."""
    progress = job.get("progress")
    if job.get("started_at") is None:
        note = "claimed"
    elif isinstance(progress, dict) and progress.get("attempt") in (None, job["attempts"]):
        note = _pct(progress) + (f" {progress['message']}" if progress.get("message") else "")
    else:
        note = "started"
    return note + ("  cancel requested" if job.get("cancel_requested") else "")


def _pct(progress: JsonObject) -> str:
    fraction = progress.get("fraction")
    return f"{float(fraction) * 100:.0f}%" if isinstance(fraction, int | float) else "?"
