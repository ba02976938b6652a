"""An instant as the API takes it: an ISO-8601 date-time, never a number.

pydantic reads a number (or a numeric string, as every query parameter is) as seconds since
1970, so `since=0.5` was a search from 1970 while the API's document says `date-time`. Here
a string must be an ISO-8601 date and time (`2025-01-31T12:00:00Z`; a date-time without an
offset is read as UTC); a `datetime` from the Python client is taken as it is. It comes out
in UTC; a date that its offset moves past year 1 or 9999 is refused, not a `500`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

ISO_RULE = "must be an ISO-8601 date and time, such as 2025-01-31T12:00:00Z"
# A date, a time to the minute at least, then what pydantic's own parser checks.
_ISO_START = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def _iso_only(value: object) -> object:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not _ISO_START.match(value):
        raise ValueError(ISO_RULE)
    return value


def as_utc(value: datetime) -> datetime:
    """`value` in UTC (naive: read as UTC); `ValueError` if that leaves datetime's range."""
    try:
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError:  # year 1 or 9999 moved by its offset past datetime's range
        raise ValueError("is out of range") from None


# As given (a naive one stays naive): for a field that reads its own range.
IsoDateTime = Annotated[datetime, BeforeValidator(_iso_only)]
Instant = Annotated[datetime, BeforeValidator(_iso_only), AfterValidator(as_utc)]


def years_up_to(year: int) -> str:
    """A pattern for a date-time string whose year is 1000 to `year` (2000 to 2999)."""
    tens, ones = divmod(year - 2000, 10)
    alternatives = [r"1\d{3}"]
    if tens:
        alternatives.append(rf"20[0-{tens - 1}]\d")
    alternatives.append(rf"20{tens}[0-{ones}]")
    return "^(?:" + "|".join(alternatives) + ")-"
