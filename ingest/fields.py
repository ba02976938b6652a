"""What a client may ask a job listing or a live event to carry beyond its default fields:
`?include=payload,result` (a job's data, up to megabytes each, is left out unless asked)."""

from __future__ import annotations

from fastapi import HTTPException

INCLUDABLE = frozenset({"payload", "result"})


def parse_include(raw: str | None) -> frozenset[str]:
    """The field names of `include` (comma-separated; empty or absent: none); an unknown
    name is a `400` naming it and the known ones."""
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
    return names
