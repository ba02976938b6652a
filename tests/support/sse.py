"""Reading the API's event streams in tests: whole, cut short, or in the background."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource

from tests.support.http import TLS


@dataclass(frozen=True)
class Ev:
    id: str
    event: str
    data: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.data.get("status"))


Until = Callable[[list[Ev]], bool]


def read_events(
    url: str,
    *,
    last_id: str | None = None,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    until: Until = lambda events: False,
    timeout: float = 30,
    stop: threading.Event | None = None,
    into: list[Ev] | None = None,
    opened: Callable[[httpx.Response], None] = lambda resp: None,
) -> list[Ev]:
    """`job` and `reset` events from one connection, until `until(events)` is true, the
    server ends the stream, `stop` is set, or `timeout` passes (then AssertionError)."""
    events: list[Ev] = into if into is not None else []
    sent = {"Accept": "text/event-stream", **(headers or {})}
    if last_id is not None:
        sent["Last-Event-ID"] = last_id
    deadline = time.monotonic() + timeout
    with httpx.stream(
        "GET",
        url,
        params=params,
        headers=sent,
        timeout=httpx.Timeout(10, read=timeout),
        verify=TLS,
    ) as resp:
        assert resp.status_code == 200, (resp.status_code, resp.read())
        opened(resp)
        for sse in EventSource(resp).iter_sse():
            if sse.event in ("job", "reset"):
                events.append(Ev(id=sse.id, event=sse.event, data=json.loads(sse.data)))
                if until(events):
                    return events
            if stop is not None and stop.is_set():
                return events
            assert time.monotonic() < deadline, f"stream not done in {timeout}s: {events}"
    return events


class Reader:
    """A client that stays connected in a thread, collecting events."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        self.events: list[Ev] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._resp: httpx.Response | None = None
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, kwargs), daemon=True)
        self._thread.start()

    def _run(self, url: str, kwargs: dict[str, Any]) -> None:
        try:
            read_events(url, stop=self._stop, into=self.events, opened=self._opened, **kwargs)
        except BaseException as exc:
            if not self._stop.is_set():
                self.error = exc

    def _opened(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.connected.set()

    def stop(self, timeout: float = 30) -> list[Ev]:
        """Hang up (closing the connection under the reading thread) and return the events."""
        self._stop.set()
        if self._resp is not None:
            self._resp.close()
        self._thread.join(timeout)
        assert self.error is None, self.error
        return self.events


def by_job(events: list[Ev]) -> dict[str, list[str]]:
    """Each job's statuses, in the order the events came."""
    out: dict[str, list[str]] = {}
    for ev in events:
        if ev.event == "job":
            out.setdefault(str(ev.data["id"]), []).append(ev.status)
    return out
