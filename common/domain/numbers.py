"""Numbers as the API takes them, in the terms of its JSON Schema document.

JSON Schema calls `1.0` an integer, and pydantic's strict int refuses it: a field the
document types `integer` takes any JSON number with no fractional part. A string or a
boolean is never read as a number.
"""

from __future__ import annotations

from typing import Any

from pydantic import BeforeValidator


def _whole(value: Any) -> Any:
    if isinstance(value, float) and not isinstance(value, bool) and value.is_integer():
        return int(value)
    return value  # anything else goes to the strict int, which refuses what is not one


# Put after an int's `Strict()` and bounds: `Annotated[int, Strict(), Field(ge=1), WHOLE]`
# (bounds inside the `Annotated`, so an optional field's document carries them too).
WHOLE = BeforeValidator(_whole)
