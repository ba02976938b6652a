"""The connections an API process holds: none sits idle for long, and idle ones never crowd
out a request.

uvicorn arms no timer before a connection's first request, and its `limit_concurrency`
counts every open connection, idle or not: 2,000 sockets that send nothing made every
request answer `503`. So Brook runs uvicorn without that limit and with this guard instead:

- a connection is *idle* while it has no request in progress: from when it opens until
  its request's headers are in, and again after each response until the next request's
  headers are in. An idle connection is closed once it has been idle for
  `BROOK_HEADER_TIMEOUT_SECONDS` (uvicorn's own keep-alive timeout, 5 s, closes one
  between requests sooner);
- at most `BROOK_MAX_CONNECTIONS` connections are held. One more arriving makes room by
  closing the connection idle the longest, unless bytes are waiting on it (a request that
  has arrived is read and served, never dropped); with none to close (all busy), the new
  connection's request is answered `503` at once.

Connections that send nothing are dropped; a request that arrives is served while any
held connection is idle. `brook_api_connections_dropped_total{reason}` counts the drops.

A request's head (request line and headers) may take `MAX_HEAD_BYTES`; beyond, it is
answered `431` and the connection closed. httptools bounds no header, and joins the
pieces of one header as they arrive, each join copying what came before: unbounded, a
head sent in many small pieces cost time quadratic in its size (a 4 MiB header in 1 KiB
writes: about a second of the loop's time), and memory without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import struct
import termios
from itertools import islice
from typing import Any, ClassVar, Protocol

from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DROPPED = Counter(
    "brook_api_connections_dropped",
    "Connections the API closed while idle: `timeout` (no request in time), `crowded` (to "
    "make room for a new connection).",
    ["reason"],
)
MAX_HEAD_BYTES = 64 * 1024  # uvicorn's URL parser refuses a URL past 64 KiB anyway
_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
)
# How many of the longest-idle connections a new one looks at for one to close (each a
# syscall): beyond them, every one had a request waiting, which is served.
SCAN = 64


class Connection(Protocol):
    def close(self) -> None:
        """Close it now (it is idle)."""

    def has_bytes_waiting(self) -> bool:
        """Whether bytes of a request have arrived that it has not read yet."""


class ConnectionGuard:
    """One per process: the connections held, and the idle ones, longest idle first."""

    def __init__(self, *, max_connections: int, header_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self._held: set[Connection] = set()
        # Insertion order is idle order: a connection idle again goes to the end.
        self._idle: dict[Connection, asyncio.TimerHandle] = {}

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def idle(self) -> int:
        return len(self._idle)

    def opened(self, conn: Connection) -> None:
        self._held.add(conn)
        self._wait_for_request(conn)
        if len(self._held) > self.max_connections:
            self._make_room(spare=conn)

    def request_started(self, conn: Connection) -> bool:
        """Its request's headers are in: no longer idle. Whether more connections are held
        than allowed (its request is then answered `503`)."""
        timer = self._idle.pop(conn, None)
        if timer is not None:
            timer.cancel()
        return len(self._held) > self.max_connections

    def request_ended(self, conn: Connection) -> None:
        """Its response went out and it stays open: idle until its next request."""
        if conn in self._held:
            self._wait_for_request(conn)

    def closed(self, conn: Connection) -> None:
        self._held.discard(conn)
        timer = self._idle.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def _wait_for_request(self, conn: Connection) -> None:
        timer = self._idle.pop(conn, None)
        if timer is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._idle[conn] = loop.call_later(self.header_timeout_s, self._timed_out, conn)

    def _timed_out(self, conn: Connection) -> None:
        if conn in self._idle:
            self._drop(conn, "timeout")

    def _make_room(self, spare: Connection) -> None:
        for conn in islice(self._idle, SCAN):
            if conn is not spare and not conn.has_bytes_waiting():
                self._drop(conn, "crowded")
                return

    def _drop(self, conn: Connection, reason: str) -> None:
        self._idle.pop(conn).cancel()
        self._held.discard(conn)  # uvicorn forgets it on `connection_lost`, a moment later
        DROPPED.labels(reason).inc()
        conn.close()


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's HTTP protocol (httptools), reporting to its process's `ConnectionGuard`,
    and refusing a request head over `MAX_HEAD_BYTES`."""

    guard: ClassVar[ConnectionGuard]
    _in_head = True  # reading a request's head (not its body)
    _heads = 0  # heads completed on this connection
    _head_bytes = 0  # bytes of the head being read, counted by whole reads

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.guard.opened(self)

    def data_received(self, data: bytes) -> None:
        in_head, heads = self._in_head, self._heads
        super().data_received(data)
        # Only reads that were all head are counted: one that ends a request and starts
        # the next is not, so the limit holds to within one read (256 KiB at most).
        if in_head and self._in_head and self._heads == heads:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                detail = b'{"detail":"request head larger than %d bytes"}' % MAX_HEAD_BYTES
                self.transport.write(_HEAD_TOO_LARGE % (len(detail), detail))
                self.transport.close()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.closed(self)
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._in_head, self._heads = False, self._heads + 1
        # uvicorn answers `503` for the limit it reads here: past the guard's, or none.
        self.limit_concurrency = 0 if self.guard.request_started(self) else None
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        idle_next = not self.pipeline  # else the next request, already in, starts now
        super().on_response_complete()
        if idle_next and not self.transport.is_closing():
            self.guard.request_ended(self)

    def close(self) -> None:
        self.transport.close()

    def has_bytes_waiting(self) -> bool:
        sock: Any = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
            return bool(struct.unpack("i", waiting)[0])
        return False


def guarded_http(guard: ConnectionGuard) -> type[GuardedHttp]:
    """The protocol class uvicorn makes each connection with, reporting to `guard`."""
    return type("GuardedHttp", (GuardedHttp,), {"guard": guard})
