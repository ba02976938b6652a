"""What the CLI prints of a job cannot drive the terminal: control characters and bidi
overrides are shown escaped, and the progress bar reads no markup."""

from __future__ import annotations

import io
from typing import Any

from brook.job_view import BarView, describe
from brook.terminal import safe
from brook.watching import event_line

HOSTILE = "boom\x1b]0;pwned\x07\x1b[2J\r\nfake line\u202eevil\x9b31m"


def job(**fields: Any) -> dict[str, Any]:
    return {
        "id": "j1",
        "task": "fail",
        "status": "failed",
        "attempts": 1,
        "max_attempts": 1,
        "created_at": "2026-01-01T00:00:00",
        **fields,
    }


def printable(text: str) -> bool:
    return not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0x202A <= ord(c) <= 0x202E for c in text)


def test_safe_escapes_controls_and_bidi_overrides_and_keeps_the_rest() -> None:
    assert safe("plain ünïcode ✓ [bold]") == "plain ünïcode ✓ [bold]"
    assert safe("a\x1b[31mb\nc\u202ed\x9b") == "a\\x1b[31mb\\x0ac\\u202ed\\x9b"


def test_an_error_message_with_escape_sequences_prints_as_one_inert_line() -> None:
    line = event_line(job(error={"type": "RuntimeError", "message": HOSTILE}))
    assert printable(line) and "\\x1b]0;pwned" in line and "\n" not in line and "\\x0a" in line


def test_a_progress_message_is_escaped_in_lines_and_shown_without_markup_in_the_bar() -> None:
    running = job(status="running", progress={"fraction": 0.5, "message": HOSTILE})
    assert printable(describe(running))
    out = io.StringIO()
    bar = BarView(out)
    bar.update(job(status="running", progress={"fraction": 0.5, "message": "[red]hi[/red]"}))
    bar.update(running)
    bar.close()
    text = out.getvalue()
    assert "[red]hi[/red]" in text or "\\x1b]0;pwned" in text
    assert "pwned\x07" not in text and "\u202e" not in text
