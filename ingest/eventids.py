"""Event ids: an opaque, URL-safe encoding of a change-stream position.

An id holds the resume token (so `Last-Event-ID` resumes exactly where the client was,
on any API process, while the oplog holds that point), the server's wall time there (for
the catch-up after history was lost), and, on a per-job stream's last event, a flag that
the stream ended there (so a client that reconnects anyway is told there is nothing more).
Layout, before base64url: version (1 byte), flags (1), wall time in ms (8), the token's
`_data` bytes.
"""

from __future__ import annotations

import base64
import binascii
import struct
from dataclasses import dataclass

from ingest.live import Position

VERSION = 1
FINAL = 0x01
_HEAD = struct.Struct(">BBQ")
MAX_LENGTH = 1024


class InvalidEventId(ValueError):
    pass


@dataclass(frozen=True, kw_only=True)
class EventId:
    at: Position
    final: bool = False


def encode_id(at: Position, *, final: bool = False) -> str:
    head = _HEAD.pack(VERSION, FINAL if final else 0, max(at.wall_ms, 0))
    raw = head + bytes.fromhex(at.key)
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_id(text: str) -> EventId:
    """The position an id names; `InvalidEventId` for anything this API did not hand out."""
    text = text.strip()
    if not text or len(text) > MAX_LENGTH:
        raise InvalidEventId("Last-Event-ID is empty or too long")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        version, flags, wall = _HEAD.unpack_from(raw)
    except (binascii.Error, ValueError, struct.error):
        raise InvalidEventId("Last-Event-ID is not an event id of this API") from None
    token = raw[_HEAD.size :]
    if version != VERSION or not token:
        raise InvalidEventId("Last-Event-ID is not an event id of this API")
    return EventId(
        at=Position(token={"_data": token.hex().upper()}, wall_ms=wall),
        final=bool(flags & FINAL),
    )
