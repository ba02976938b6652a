"""The CLI's view of a job's output stream (`GET /jobs/{id}/output`): `brook output`, and
the output that `brook submit --wait` and `brook watch ID` show as it comes.

The stream is followed as server-sent events (never polling), resumed with
`Last-Event-ID` after a cut, and ends with its `end` event. `brook submit --wait` and
`brook watch ID` follow it on a thread of its own beside the job's event stream
(`OutputFollower`), and wait for its end before they show the job's.

What a task emits is its own: on a terminal, control characters other than newline and
tab are shown escaped (`brook.terminal.safe_text`); into a pipe or a file it goes as it is.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, TextIO

from brook.common.runtime.settings import Settings
from brook.terminal import safe_text
from brook.watching import StreamFailed, follow

JsonObject = dict[str, Any]
OUTPUT_EVENTS = ("output", "attempt", "end")


def chunk_text(chunk: JsonObject) -> str:
    """A chunk as `?format=text` shows it: text as it is, a JSON value on a line."""
    if chunk.get("kind") == "text":
        return str(chunk.get("data"))
    return json.dumps(chunk.get("data"), separators=(",", ":")) + "\n"


class TextSink:
    """Writes output text to a stream, made safe on a terminal, and knows whether the last
    thing written ended its line (so a note can start on a line of its own)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._tty = stream.isatty()
        self.at_line_start = True

    def write(self, text: str) -> None:
        if not text:
            return
        self.stream.write(safe_text(text) if self._tty else text)
        self.stream.flush()
        self.at_line_start = text.endswith("\n")

    def note(self, line: str) -> None:
        """A line of Brook's own (an attempt's start), on a line of its own."""
        self.end_line()
        self.stream.write(line + "\n")
        self.stream.flush()

    def end_line(self) -> None:
        if not self.at_line_start:
            self.stream.write("\n")
            self.stream.flush()
            self.at_line_start = True


class OutputPrinter:
    """What `brook output --follow` prints: the chunks' text on `out` (or each chunk as a
    JSON line, `as_json`), and on `notes` a line when a later attempt's output begins."""

    def __init__(self, out: TextIO, notes: TextIO, *, as_json: bool = False) -> None:
        self.out = TextSink(out)
        self.notes = TextSink(notes) if notes is not out else self.out
        self.as_json = as_json
        self._attempt: int | None = None

    def attempt(self, attempt: int) -> None:
        if self._attempt is not None and not self.as_json:
            self.out.end_line()
            self.notes.note(f"# attempt {attempt}")
        self._attempt = attempt

    def chunk(self, chunk: JsonObject) -> None:
        if self.as_json:
            self.out.write(json.dumps(chunk) + "\n")
        else:
            self.out.write(chunk_text(chunk))


class WatchPrinter:
    """`brook watch ID`'s stdout: one line per event, and between them the job's output
    as it comes (`as_json`: each chunk as a JSON line `{"chunk": chunk}`). Fed from two
    threads (the job's events, its output)."""

    def __init__(self, out: TextIO, *, as_json: bool = False) -> None:
        self.sink = TextSink(out)
        self.as_json = as_json
        self._lock = threading.Lock()

    def event(self, line: str) -> None:
        with self._lock:
            self.sink.note(line)

    def output(self, kind: str, data: JsonObject) -> None:
        if kind != "output":
            return
        with self._lock:
            if self.as_json:
                self.sink.note(json.dumps({"chunk": data}))
            else:
                self.sink.write(chunk_text(data))


def follow_output(
    settings: Settings,
    job_id: str,
    on_event: Callable[[str, JsonObject], None],
    *,
    params: dict[str, str] | None = None,
    after: str | None = None,
    deadline: float = float("inf"),
) -> JsonObject | None:
    """Follow the job's output stream to its end: `on_event(kind, data)` for each `output`
    and `attempt` event. Returns the `end` event's data (`{"status"}`), or None if
    `deadline` (monotonic) passed first. `StreamFailed` if the API refused it."""
    ended: list[JsonObject] = []

    def each(kind: str, data: JsonObject) -> bool:
        if kind == "end":
            ended.append(data)
            return True
        on_event(kind, data)
        return False

    follow(
        settings,
        f"/jobs/{job_id}/output",
        each,
        params=params,
        deadline=deadline,
        kinds=OUTPUT_EVENTS,
        last_id=after,
    )
    return ended[0] if ended else None


class OutputFollower:
    """A job's output followed on a daemon thread, each `output` and `attempt` event handed
    to `on_event` there; `finish` waits for the stream's end."""

    def __init__(
        self,
        settings: Settings,
        job_id: str,
        on_event: Callable[[str, JsonObject], None],
        *,
        deadline: float = float("inf"),
    ) -> None:
        self.error: str | None = None
        self._args = (settings, job_id, on_event, deadline)
        self._thread = threading.Thread(target=self._run, name="brook-output", daemon=True)

    def start(self) -> OutputFollower:
        self._thread.start()
        return self

    def _run(self) -> None:
        settings, job_id, on_event, deadline = self._args
        try:
            follow_output(settings, job_id, on_event, deadline=deadline)
        except StreamFailed as exc:  # an API without output streams, say: the rest goes on
            self.error = str(exc)

    def finish(self, timeout: float) -> None:
        """Wait up to `timeout` s for the stream's end (the job has ended: its `end` comes
        right after its last chunks)."""
        self._thread.join(timeout)
