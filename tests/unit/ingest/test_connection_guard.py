"""The connection guard in a real uvicorn server (in this process, a minimal app, no
database): a request that has arrived is served while idle sockets are closed to make room,
and a connection that never completes its headers is closed after the timeout."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
import uvloop

from brook.ingest.connection_guard import ConnectionGuard, guarded_http
from tests.support.procs import wait_until

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


async def ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):  # the whole body first
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@dataclass
class Server:
    guard: ConnectionGuard
    loop: asyncio.AbstractEventLoop
    port: int

    def connect(self, request: bytes = b"") -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        if request:
            sock.sendall(request)
        return sock

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The server's event loop blocked: what connects meanwhile waits to be accepted."""
        started, release = threading.Event(), threading.Event()

        def block() -> None:
            started.set()
            release.wait(10)

        self.loop.call_soon_threadsafe(block)
        assert started.wait(10)
        try:
            yield
        finally:
            release.set()


@contextlib.contextmanager
def serving(loop_name: str, max_connections: int, timeout_s: float) -> Iterator[Server]:
    guard = ConnectionGuard(max_connections=max_connections, header_timeout_s=timeout_s)
    listener = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        ok, http=guarded_http(guard), ws="none", lifespan="off", log_config=None, loop="none"
    )
    server = uvicorn.Server(config)
    loop = LOOPS[loop_name]()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(server.serve(sockets=[listener]),)
    )
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=10)
        yield Server(guard, loop, listener.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(10)
        loop.close()
        listener.close()


GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def closed_by_the_server(sock: socket.socket) -> bool:
    sock.settimeout(0)
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_a_request_that_arrived_is_served_while_idle_sockets_make_room(loop_name: str) -> None:
    with serving(loop_name, max_connections=8, timeout_s=60) as server, contextlib.ExitStack() as s:
        old = [s.enter_context(server.connect()) for _ in range(4)]
        wait_until(lambda: server.guard.idle == 4)
        with server.frozen():
            # Accepted together once the loop runs again: the request's bytes wait unread
            # on its socket while eight idle ones, connected after it, want room (asyncio
            # makes all nine connections before reading any; uvloop may read it first).
            asking = s.enter_context(server.connect(GET))
            new = [s.enter_context(server.connect()) for _ in range(8)]
        assert asking.recv(1024).startswith(b"HTTP/1.1 200 ")
        # Room was made by closing the connections idle the longest, never the one asking.
        wait_until(lambda: all(closed_by_the_server(sock) for sock in [*old, new[0]]))
        assert server.guard.held == 8
        assert not any(closed_by_the_server(sock) for sock in new[1:])


def test_with_every_held_connection_busy_one_more_is_answered_503() -> None:
    with serving("asyncio", max_connections=2, timeout_s=60) as server, contextlib.ExitStack() as s:
        partial = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"
        busy = [s.enter_context(server.connect(partial)) for _ in range(2)]  # bodies to come
        wait_until(lambda: server.guard.idle == 0 and server.guard.held == 2)
        assert s.enter_context(server.connect(GET)).recv(1024).startswith(b"HTTP/1.1 503 ")
        for sock in busy:
            sock.sendall(b"0123456789")
            assert sock.recv(1024).startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_a_connection_without_complete_headers_in_time_is_closed(loop_name: str) -> None:
    with serving(loop_name, max_connections=100, timeout_s=0.5) as server, contextlib.ExitStack() as s:
        silent = s.enter_context(server.connect())
        # A byte of headers every 0.1 s: never silent for long, never a request; the same
        # after a first request was served (which stops uvicorn's keep-alive timer).
        trickling = [s.enter_context(server.connect(b"GET / HTTP/1.1\r\n"))]
        served = s.enter_context(server.connect(GET))
        assert served.recv(1024).startswith(b"HTTP/1.1 200 ")
        served.sendall(b"GET / HTTP/1.1\r\n")
        trickling.append(served)

        def trickled_until_closed() -> bool:
            for sock in trickling:
                with contextlib.suppress(OSError):
                    sock.sendall(b"X")
            return all(closed_by_the_server(sock) for sock in trickling)

        wait_until(trickled_until_closed, timeout=10, interval=0.1)
        wait_until(lambda: closed_by_the_server(silent))
        assert server.guard.held == 0
