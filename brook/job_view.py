"""How the CLI shows a job while it is waited for: a progress bar on a terminal (`rich`),
one plain line per change otherwise.

A view is fed the job as the API returns it, once per update (from its event stream), and
the text its task emits (from its output stream), as it comes. It writes to stderr, so
stdout carries only the result and `brook submit --wait ... | jq` stays clean.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol, TextIO

from brook.output_follow import TextSink
from brook.terminal import safe, safe_text

JsonObject = dict[str, Any]
TAIL = 40  # characters of the output's current line shown beside the bar


class JobView(Protocol):
    def update(self, job: JsonObject) -> None: ...

    def output(self, text: str) -> None:
        """Text the job's task emitted (`ctx.emit`), shown as it comes."""

    def close(self) -> None: ...


def job_view(stream: TextIO | None = None) -> JobView:
    """A bar if `stream` (default stderr) is a terminal, else plain lines."""
    out = stream if stream is not None else sys.stderr
    return BarView(out) if out.isatty() else LineView(out)


def describe(job: JsonObject) -> str:
    """`<id> <status>[ <percent>%][ <message>]`: one line for a job's state, safe to print."""
    return safe(_describe(job))


def _describe(job: JsonObject) -> str:
    line = f"{job.get('id')} {job.get('status')}"
    progress = job.get("progress")
    if isinstance(progress, dict):
        fraction = progress.get("fraction")
        if isinstance(fraction, (int, float)):
            line += f" {fraction * 100:.0f}%"
        if progress.get("message"):
            line += f" {progress['message']}"
    return line


class LineView:
    """One line each time the job's status or progress changes."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._last = ""
        self._text = TextSink(stream)

    def update(self, job: JsonObject) -> None:
        line = describe(job)
        if line != self._last:
            self._text.note(line)
            self._last = line

    def output(self, text: str) -> None:
        self._text.write(text)

    def close(self) -> None:
        self._text.end_line()


class BarView:
    """A `rich` progress bar: the job's status, its fraction (a pulse until the task
    reports one), its message and the time elapsed; full once the job completed."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._bar = Progress(
            # Markup off: a task's message is shown as it is, never read as markup.
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[message]}", markup=False),
            TimeElapsedColumn(),
            # The output's line being written (the lines it ended go above the bar).
            TextColumn("{task.fields[tail]}", markup=False),
            console=Console(file=stream),
        )
        self._task = self._bar.add_task("", total=None, message="", tail="")
        self._bar.start()
        self._partial = ""  # output after its last newline: printed once its line ends

    def output(self, text: str) -> None:
        """Whole lines, printed above the bar (which stays at the bottom); the end of the
        line being written, beside the bar, as it comes."""
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._bar.console.print(safe_text(line), markup=False, highlight=False)
        tail = self._partial[-TAIL:]
        if len(self._partial) > TAIL:
            tail = "…" + tail[1:]
        self._bar.update(self._task, tail=safe(tail))

    def update(self, job: JsonObject) -> None:
        progress = job.get("progress") if isinstance(job.get("progress"), dict) else None
        fraction = progress.get("fraction") if progress else None
        total: float | None = 1.0
        if job.get("status") == "completed":
            fraction = 1.0
        elif not isinstance(fraction, (int, float)):
            total = None  # nothing reported yet: a pulsing bar
        self._bar.update(
            self._task,
            description=safe(f"{job.get('task')} {job.get('status')}"),
            total=total,
            completed=float(fraction or 0.0),
            message=safe((progress or {}).get("message") or ""),
        )

    def close(self) -> None:
        if self._partial:
            self.output("\n")
        self._bar.stop()
