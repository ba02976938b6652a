"""Text from a job (a task's error message, its progress message, a name) made safe to
show on a terminal: a task may put anything in them, escape sequences included, which a
terminal would obey (move the cursor, rewrite earlier lines, set the window title, ...).

Every control character (C0, DEL, C1: ESC, CR, BEL, newlines too, so one event stays one
line) and every bidirectional-override character is shown as a Python-style escape
(`\\x1b`, `\\n`, `\\u202e`); everything else is printed as it is. `rich` markup is not
this module's business: the progress bar shows its text with markup off.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls; the Unicode bidi embeddings, overrides and isolates; the
# line and paragraph separators.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object) -> str:
    """`text` as a string with nothing a terminal would act on."""
    return _UNSAFE.sub(_escape, str(text))


# As `_UNSAFE`, but newline and tab pass: for a task's output, shown as lines of text.
_UNSAFE_IN_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def safe_text(text: str) -> str:
    """`text` (many lines) with nothing a terminal would act on but its newlines and tabs."""
    return _UNSAFE_IN_TEXT.sub(_escape, text)
