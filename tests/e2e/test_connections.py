"""Idle sockets cannot lock the API out: a real `brook api`, and 2,000 TCP connections that
never send a byte (no token needed to open them)."""

from __future__ import annotations

import contextlib
import resource
import socket
from collections.abc import Iterator

import httpx

from tests.e2e.conftest import Cluster
from tests.support.http import TLS
from tests.support.metrics import value
from tests.support.procs import wait_until

IDLE = 2000  # BROOK_MAX_CONNECTIONS's default: once, every slot uvicorn had
TIMEOUT_S = 3.0


@contextlib.contextmanager
def open_files(needed: int) -> Iterator[None]:
    """This process may hold `needed` sockets (its soft limit raised, then restored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        assert hard >= needed, f"the hard limit on open files ({hard}) is below {needed}"
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def answered(url: str) -> None:
    """`/healthz` and a submit, each on a new connection, answered: not `503`."""
    assert httpx.get(f"{url}/healthz", timeout=10, verify=TLS).status_code == 200
    made = httpx.post(f"{url}/jobs", json={"task": "noop"}, timeout=10, verify=TLS)
    assert made.status_code == 202, made.text


def closed_by_the_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False  # open, nothing to read
    except ConnectionResetError:
        return True


def test_idle_sockets_cannot_lock_out_the_api_and_are_closed_after_the_header_timeout(
    cluster: Cluster,
) -> None:
    cluster.api(BROOK_HEADER_TIMEOUT_SECONDS=str(TIMEOUT_S))
    url = cluster.api_url
    sockets: list[socket.socket] = []
    with open_files(IDLE + 500), contextlib.ExitStack() as stack:
        for i in range(IDLE):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", cluster.port)))
            sock.setblocking(False)
            sockets.append(sock)
            if i % 250 == 249:
                answered(url)  # throughout: uvicorn alone answered 503 from here on
        answered(url)
        # One of them that sends its request after all is served like any other.
        late = sockets[-1]
        late.setblocking(True)
        late.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{cluster.port}\r\n\r\n".encode())
        assert late.recv(1024).startswith(b"HTTP/1.1 200 ")
        late.setblocking(False)
        # Every one of them is closed once idle for the timeout (the late one too, idle again).
        open_ = set(sockets)

        def all_closed() -> bool:
            open_.difference_update([s for s in open_ if closed_by_the_server(s)])
            return not open_

        wait_until(all_closed, timeout=TIMEOUT_S + 30, interval=0.5)
        answered(url)
    metrics = httpx.get(f"{url}/metrics", timeout=10, verify=TLS).text
    dropped = value(metrics, "brook_api_connections_dropped_total", reason="timeout")
    assert dropped >= IDLE - 50, dropped  # a few made room for the requests instead
