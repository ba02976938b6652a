"""`include`: the fields a list page or an event stream leaves out unless asked for.

A job's `payload` (up to the body limit) and `result` (up to 8 MiB) are most of its bytes,
so `GET /jobs` pages and live events leave them out; `?include=payload,result` (either or
both, comma-separated) asks for them, read per job.
"""

from __future__ import annotations

from fastapi import HTTPException

INCLUDABLE = ("payload", "result")


def parse_include(raw: str | None) -> frozenset[str]:
    """The names `?include=` asks for; `400` naming the first unknown one."""
    if raw is None:
        return frozenset()
    names = frozenset(part.strip() for part in raw.split(",") if part.strip())
    unknown = sorted(names - set(INCLUDABLE))
    if unknown:
        raise HTTPException(
            400, f"include: unknown field {unknown[0]!r}; known: {', '.join(INCLUDABLE)}"
        )
    return names
