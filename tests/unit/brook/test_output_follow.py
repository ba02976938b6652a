"""How the CLI prints a job's output: chunks as they are (JSON ones a line each), a note
where a later attempt's output begins, made safe on a terminal."""

from __future__ import annotations

import io
import json

from brook.output_follow import OutputPrinter, WatchPrinter, chunk_text
from brook.terminal import safe_text
from tests.unit.brook.test_job_view import Terminal


def chunk(attempt: int, seq: int, data: object) -> dict[str, object]:
    kind = "text" if isinstance(data, str) else "json"
    return {"attempt": attempt, "seq": seq, "kind": kind, "data": data}


def test_output_is_printed_as_it_is_json_a_line_each_and_a_new_attempt_noted_apart() -> None:
    out, notes = io.StringIO(), io.StringIO()
    printer = OutputPrinter(out, notes)
    printer.attempt(1)
    printer.chunk(chunk(1, 1, "the \x1b[1m"))
    printer.chunk(chunk(1, 2, {"n": 1}))
    printer.chunk(chunk(1, 3, "half"))
    printer.attempt(2)
    printer.chunk(chunk(2, 4, "again"))
    assert out.getvalue() == 'the \x1b[1m{"n":1}\nhalf\nagain'  # a pipe gets it as it is
    assert notes.getvalue() == "# attempt 2\n"
    assert chunk_text(chunk(1, 1, [1, "a"])) == '[1,"a"]\n'


def test_on_a_terminal_output_keeps_its_lines_and_tabs_and_nothing_else_it_could_obey() -> None:
    assert safe_text("a\tb\nc\x1b[2J\r\x07\u202e") == "a\tb\nc\\x1b[2J\\x0d\\x07\\u202e"
    screen = Terminal()
    OutputPrinter(screen, screen).chunk(chunk(1, 1, "ok\n\x1b]0;title\x07"))
    assert screen.getvalue() == "ok\n\\x1b]0;title\\x07"


def test_watch_puts_each_event_on_a_line_of_its_own_between_the_output() -> None:
    out = io.StringIO()
    printer = WatchPrinter(out)
    printer.event("e1 running")
    printer.output("output", chunk(1, 1, "tok "))
    printer.output("attempt", {"attempt": 1})  # not printed: the events say it
    printer.event("e1 completed")
    assert out.getvalue() == "e1 running\ntok \ne1 completed\n"
    as_json = io.StringIO()
    printer = WatchPrinter(as_json, as_json=True)
    printer.output("output", chunk(1, 1, "tok "))
    assert json.loads(as_json.getvalue()) == {"chunk": chunk(1, 1, "tok ")}
