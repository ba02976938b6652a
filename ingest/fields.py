"""What a client may ask a job listing or a live event to carry beyond its default fields:
`?include=payload,result` (a job's data, up to megabytes each, is left out unless asked)."""

from __future__ import annotations

import re

from fastapi import HTTPException

INCLUDABLE = frozenset({"payload", "result"})
# What `include` may be, as the OpenAPI document says: names among INCLUDABLE, separated by
# commas, spaces around them and empty items allowed.
INCLUDE_PATTERN = r"^ *(?:(?:payload|result) *)?(?:, *(?:(?:payload|result) *)?)*$"
_INCLUDE = re.compile(INCLUDE_PATTERN)


def parse_include(raw: str | None) -> frozenset[str]:
    """The field names of `include` (comma-separated; empty or absent: none); an unknown
    name (or any text but names, commas and spaces) is a `400` naming the known ones."""
    if raw is None:
        return frozenset()
    names = frozenset(part.strip() for part in raw.split(",") if part.strip())
    unknown = names - INCLUDABLE
    if unknown:
        raise HTTPException(
            400,
            f"include: unknown field {', '.join(repr(n) for n in sorted(unknown))};"
            f" known: {', '.join(sorted(INCLUDABLE))}",
        )
    if not _INCLUDE.fullmatch(raw):
        raise HTTPException(400, "include: field names (payload, result), comma-separated")
    return names
