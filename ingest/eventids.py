"""Event ids: an opaque, URL-safe, signed encoding of a change-stream position.

An id holds the resume token (so `Last-Event-ID` resumes exactly where the client was,
on any API process, while the oplog holds that point), the server's wall time there (for
the catch-up after history was lost), and, on a per-job stream's last event, a flag that
the stream ended there (so a client that reconnects anyway is told there is nothing more).
Layout, before base64url: version (1 byte), flags (1), wall time in ms (8), the token's
`_data` bytes, then an HMAC-SHA256 of all that, cut to 16 bytes.

Why a MAC rather than strict decoding: a resume token is the server's own format (a
KeyString, with more inside than a cluster time), so no check of its shape here can tell
a token the server handed out from a well-formed forgery, which would still reach
mongod's parser and cost a failed catch-up (and a scan for the reset) per request. A MAC
refuses every id this deployment did not issue, at once and without any database work,
and keeps ids valid on every API process and across restarts, since its key is one
secret per deployment, made once and kept in MongoDB (`deployment_secret`). The wall
time is range-checked all the same.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import struct
import time
from dataclasses import dataclass

from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.models import Doc
from brook.common.store.meta import deployment_secret
from brook.ingest.live import Position

VERSION = 2  # 1: unsigned ids (from before), refused
FINAL = 0x01
_HEAD = struct.Struct(">BBQ")
MAC_BYTES = 16
MAX_LENGTH = 1024  # characters of a Last-Event-ID, at most
MAX_TOKEN_BYTES = 512
MIN_WALL_MS = 1_262_304_000_000  # 2010-01-01: no change stream is older
FUTURE_SLACK_MS = 86_400_000  # a clock a day ahead, at most
SECRET_NAME = "event_ids"


class InvalidEventId(ValueError):
    pass


@dataclass(frozen=True, kw_only=True)
class EventId:
    at: Position
    final: bool = False


_NOT_OURS = "Last-Event-ID is not an event id of this API"


@dataclass(frozen=True)
class EventIds:
    """Encodes and checks the ids of one deployment (`key`: its secret)."""

    key: bytes

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self.key, body, hashlib.sha256).digest()[:MAC_BYTES]

    def encode(self, at: Position, *, final: bool = False) -> str:
        body = _HEAD.pack(VERSION, FINAL if final else 0, max(at.wall_ms, 0))
        body += bytes.fromhex(at.key)
        raw = body + self._mac(body)
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def decode(self, text: str) -> EventId:
        """The position an id names; `InvalidEventId` for anything this API did not hand
        out (checked before anything else is done with it)."""
        text = text.strip()
        if not text or len(text) > MAX_LENGTH:
            raise InvalidEventId("Last-Event-ID is empty or too long")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise InvalidEventId(_NOT_OURS) from None
        body, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
        if len(body) <= _HEAD.size or not hmac.compare_digest(mac, self._mac(body)):
            raise InvalidEventId(_NOT_OURS)
        version, flags, wall = _HEAD.unpack_from(body)
        token = body[_HEAD.size :]
        if version != VERSION or flags & ~FINAL or len(token) > MAX_TOKEN_BYTES:
            raise InvalidEventId(_NOT_OURS)
        if not MIN_WALL_MS <= wall <= time.time() * 1000 + FUTURE_SLACK_MS:
            raise InvalidEventId("Last-Event-ID holds a time out of range")
        return EventId(
            at=Position(token={"_data": token.hex().upper()}, wall_ms=wall),
            final=bool(flags & FINAL),
        )


class DeploymentIds:
    """The deployment's `EventIds`, its key read (or made) once, on first use."""

    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self._db = db
        self._ids: EventIds | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> EventIds:
        if self._ids is None:
            async with self._lock:
                if self._ids is None:
                    self._ids = EventIds(await deployment_secret(self._db, SECRET_NAME))
        return self._ids
