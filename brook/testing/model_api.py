"""A stand-in for a model provider's API: tokens streamed at a set pace, a tokens-per-minute
limit answered with real `429`s and `Retry-After`.

No model or provider is reachable from the machines Brook is built and tested on, and a real
one would make tests slow, costly and flaky. This server behaves, for what a job engine
cares about, like the chat-completions endpoint of the common providers:

* `POST /v1/chat/completions` with `{"model", "messages", "max_tokens", "stream"}`. It
  answers `max_tokens` tokens (the server's `tokens` when the request names none), spread
  over `seconds` (the server's pace; a request may ask for its own with `"seconds"`).
  With `"stream": true` they come as server-sent events, one `data:` chunk a token
  (`{"choices": [{"delta": {"content": ...}}]}`), then a chunk with `usage` and
  `data: [DONE]`; without it, one JSON body after the whole wait. `usage` is
  `{"prompt_tokens", "completion_tokens", "total_tokens"}`: prompt tokens are the
  messages' characters / 4 (at least 1), completion tokens the tokens sent.
* A tokens-per-minute limit (`tpm`), in a sliding window of `window_s` seconds (60 unless
  told): a request is charged its prompt tokens plus its `max_tokens` when it arrives, as
  providers reserve them. One that would take the window past the limit is refused with
  `429`, `Retry-After` (whole seconds, rounded up) and `retry-after-ms` (the moment enough
  of the window has expired), and the `x-ratelimit-remaining-tokens` header; it is not
  charged. A request larger than the whole limit is refused with `400`
  (`request_too_large`), since waiting would never help.
* `GET /stats`: requests, answered, refused (`rate_limited`), tokens charged and sent, and
  the most requests in flight at once, for benchmarks to report the share of 429s.
* `POST /stats/reset` zeroes them (the window too).
* `GET /calls`: the latest calls (up to 100,000), each `{"at"` (wall-clock seconds),
  `"charge"`, `"window"` (what the window held before it), `"status"` (200, 429),
  `"wait"` (a 429's seconds to wait) and `"user"` (the request's `user` field, say a job's
  id)}`, for benchmarks to tell why each 429 came.
* `POST /limit` `{"tpm": n}` changes the limit from now on, telling no client (a provider
  that lowered it): for benchmarks of a client's adaptation.

The text is deterministic: the words of the last message, over and over (or a fixed
sentence), so a test can check what a job streamed.

Run it in this process (`ModelAPI(...).running()`, a context manager serving from a thread
of its own), as a child process (`ModelAPI(...).process()`, for benchmarks, so its event loop
does not share the benchmark's CPU time), or from a shell:

    python -m brook.testing.model_api --port 8900 --tokens 50 --seconds 2 --tpm 20000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FILLER = "Brook runs the jobs of a pipeline once each, whatever fails around them."
MAX_TOKENS = 100_000  # a request may ask for at most this many tokens
MAX_SECONDS = 3600.0  # and a pace of at most this long


@dataclass
class Limiter:
    """A sliding window of token charges: (monotonic time, tokens), oldest first."""

    tpm: int | None
    window_s: float = 60.0
    charges: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    in_window: int = 0

    def _expire(self, now: float) -> None:
        while self.charges and self.charges[0][0] <= now - self.window_s:
            self.in_window -= self.charges.popleft()[1]

    def held(self, now: float) -> int:
        """What the window holds at `now`."""
        self._expire(now)
        return self.in_window

    def remaining(self, now: float) -> int | None:
        if self.tpm is None:
            return None
        self._expire(now)
        return max(0, self.tpm - self.in_window)

    def take(self, tokens: int, now: float) -> float | None:
        """Charge `tokens` now, or the seconds to wait until they would fit (not charged)."""
        if self.tpm is None:
            return None
        self._expire(now)
        if self.in_window + tokens <= self.tpm:
            self.charges.append((now, tokens))
            self.in_window += tokens
            return None
        # The earliest moment enough of the window has expired for `tokens` to fit.
        excess = self.in_window + tokens - self.tpm
        freed = 0
        for at, charged in self.charges:
            freed += charged
            if freed >= excess:
                return max(0.001, at + self.window_s - now)
        return self.window_s  # not reached: a request over the whole limit is refused first

    def reset(self) -> None:
        self.charges.clear()
        self.in_window = 0


@dataclass
class Stats:
    requests: int = 0
    answered: int = 0
    rate_limited: int = 0
    too_large: int = 0
    tokens_charged: int = 0
    tokens_sent: int = 0
    in_flight: int = 0
    max_in_flight: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


MAX_CALLS = 100_000  # the calls `GET /calls` remembers


class BadRequest(Exception):
    pass


@dataclass(frozen=True)
class Ask:
    """One chat-completions request, checked."""

    text: str
    prompt_tokens: int
    max_tokens: int
    seconds: float
    stream: bool
    model: str
    user: str | None = None


def _ask(body: Any, tokens: int, seconds: float) -> Ask:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    messages = body.get("messages", [])
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages must be a list of objects")
    contents = [m.get("content") for m in messages]
    if not all(isinstance(c, str) for c in contents):
        raise BadRequest("each message needs a string content")
    text = "".join(str(c) for c in contents)
    n = body.get("max_tokens", tokens)
    if type(n) is not int or not 1 <= n <= MAX_TOKENS:
        raise BadRequest(f"max_tokens must be a whole number from 1 to {MAX_TOKENS}")
    pace = body.get("seconds", seconds)
    if type(pace) not in (int, float) or not 0 <= pace <= MAX_SECONDS:
        raise BadRequest(f"seconds must be a number from 0 to {MAX_SECONDS:g}")
    last = str(contents[-1]) if contents else ""
    return Ask(
        text=last,
        prompt_tokens=max(1, len(text) // 4),
        max_tokens=n,
        seconds=float(pace),
        stream=bool(body.get("stream", False)),
        model=str(body.get("model", "stand-in")),
        user=str(body["user"]) if isinstance(body.get("user"), str) else None,
    )


def words(text: str, n: int) -> list[str]:
    """The `n` tokens answered to `text`: its words over and over, each with a space."""
    source = re.findall(r"\S+", text) or FILLER.split()
    return [source[i % len(source)] + " " for i in range(n)]


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"error": {"type": kind, "code": kind, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


class ModelAPI:
    """The stand-in's settings, its app, and ways to run it."""

    def __init__(
        self,
        *,
        tokens: int = 50,
        seconds: float = 2.0,
        tpm: int | None = None,
        window_s: float = 60.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.tokens = tokens
        self.seconds = seconds
        self.limiter = Limiter(tpm, window_s)
        self.stats = Stats()
        self.calls: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_CALLS)
        self.host = host
        self.port = port
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._complete, methods=["POST"]),
                Route("/stats", self._stats, methods=["GET"]),
                Route("/stats/reset", self._reset, methods=["POST"]),
                Route("/calls", self._calls, methods=["GET"]),
                Route("/limit", self._limit, methods=["POST"]),
            ]
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- the endpoints

    async def _stats(self, _: Request) -> Response:
        return JSONResponse(self.stats.as_dict())

    async def _calls(self, _: Request) -> Response:
        return JSONResponse({"calls": list(self.calls)})

    async def _reset(self, _: Request) -> Response:
        self.stats = Stats()
        self.calls.clear()
        self.limiter.reset()
        return JSONResponse(self.stats.as_dict())

    async def _limit(self, request: Request) -> Response:
        """`{"tpm": n}`: a new tokens-per-window limit from now on (the provider changed
        it, telling no one); the window's charges stay."""
        body = json.loads(await request.body() or b"{}")
        tpm = body.get("tpm") if isinstance(body, dict) else None
        if isinstance(tpm, bool) or not isinstance(tpm, int) or tpm < 1:
            return _error(400, "invalid_request_error", "tpm: a whole number >= 1")
        self.limiter.tpm = tpm
        return JSONResponse({"tpm": tpm})

    async def _complete(self, request: Request) -> Response:
        self.stats.requests += 1
        try:
            ask = _ask(json.loads(await request.body() or b"{}"), self.tokens, self.seconds)
        except (BadRequest, ValueError) as exc:
            return _error(400, "invalid_request_error", str(exc))
        charge = ask.prompt_tokens + ask.max_tokens
        tpm = self.limiter.tpm
        if tpm is not None and charge > tpm:
            self.stats.too_large += 1
            msg = f"this request needs {charge} tokens; the limit is {tpm} a window"
            return _error(400, "request_too_large", msg)
        now = time.monotonic()
        held = self.limiter.held(now)
        wait = self.limiter.take(charge, now)
        self.calls.append(
            {
                "at": time.time(),
                "charge": charge,
                "window": held,
                "status": 200 if wait is None else 429,
                "wait": wait,
                "user": ask.user,
            }
        )
        if wait is not None:
            self.stats.rate_limited += 1
            headers = {
                "Retry-After": str(math.ceil(wait)),
                "retry-after-ms": str(math.ceil(wait * 1000)),
                "x-ratelimit-limit-tokens": str(tpm),
                "x-ratelimit-remaining-tokens": str(self.limiter.remaining(now)),
            }
            msg = f"rate limit of {tpm} tokens per {self.limiter.window_s:g} s reached"
            return _error(429, "rate_limit_exceeded", msg, headers)
        self.stats.tokens_charged += charge
        if ask.stream:
            return StreamingResponse(self._stream(ask), media_type="text/event-stream")
        async with self._flight():
            await asyncio.sleep(ask.seconds)
            text = "".join(words(ask.text, ask.max_tokens))
            self.stats.tokens_sent += ask.max_tokens
            self.stats.answered += 1
        return JSONResponse(
            {
                "object": "chat.completion",
                "model": ask.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "length",
                    }
                ],
                "usage": _usage(ask, ask.max_tokens),
            }
        )

    async def _stream(self, ask: Ask) -> AsyncIterator[str]:
        pause = ask.seconds / ask.max_tokens
        sent = 0
        async with self._flight():
            for token in words(ask.text, ask.max_tokens):
                await asyncio.sleep(pause)
                chunk = {
                    "object": "chat.completion.chunk",
                    "model": ask.model,
                    "choices": [{"index": 0, "delta": {"content": token}}],
                }
                yield f"data: {json.dumps(chunk)}\n\n"
                sent += 1
                self.stats.tokens_sent += 1
            last = {
                "object": "chat.completion.chunk",
                "model": ask.model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                "usage": _usage(ask, sent),
            }
            yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n"
            self.stats.answered += 1

    @contextlib.asynccontextmanager
    async def _flight(self) -> AsyncIterator[None]:
        self.stats.in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
        try:
            yield
        finally:
            self.stats.in_flight -= 1

    # -- ways to run it

    @contextlib.contextmanager
    def running(self) -> Iterator[ModelAPI]:
        """Serve from a thread of this process until the block ends."""
        import uvicorn

        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off", backlog=4096
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])),
            daemon=True,
            name="model-api",
        )
        thread.start()
        try:
            while not server.started:
                if not thread.is_alive():
                    raise RuntimeError("the model API stand-in did not start")
                time.sleep(0.01)
            yield self
        finally:
            server.should_exit = True
            thread.join(10)
            sock.close()

    @contextlib.contextmanager
    def process(self) -> Iterator[ModelAPI]:
        """Serve from a child process until the block ends (then it is stopped)."""
        args = [
            sys.executable,
            "-m",
            "brook.testing.model_api",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--tokens",
            str(self.tokens),
            "--seconds",
            str(self.seconds),
            "--window",
            str(self.limiter.window_s),
        ]
        if self.limiter.tpm is not None:
            args += ["--tpm", str(self.limiter.tpm)]
        child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            port = line.strip().rpartition(":")[2]  # "... listening on http://host:port"
            if not line.startswith("model API stand-in listening") or not port.isdigit():
                raise RuntimeError(f"the model API stand-in did not start: {line!r}")
            self.port = int(port)
            yield self
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


def _usage(ask: Ask, sent: int) -> dict[str, int]:
    return {
        "prompt_tokens": ask.prompt_tokens,
        "completion_tokens": sent,
        "total_tokens": ask.prompt_tokens + sent,
    }


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)  # connections queue from now on, before the server's loop runs
    return sock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m brook.testing.model_api",
        description="A model API stand-in: paced token streams, a tokens-per-minute limit.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900, help="0 picks a free port")
    parser.add_argument("--tokens", type=int, default=50, help="tokens an answer (default 50)")
    parser.add_argument("--seconds", type=float, default=2.0, help="an answer's duration")
    parser.add_argument("--tpm", type=int, default=None, help="tokens a window; none: no limit")
    parser.add_argument("--window", type=float, default=60.0, help="the window, in seconds")
    args = parser.parse_args(argv)
    import uvicorn

    api = ModelAPI(
        tokens=args.tokens,
        seconds=args.seconds,
        tpm=args.tpm,
        window_s=args.window,
        host=args.host,
        port=args.port,
    )
    sock = _bind(api.host, api.port)
    api.port = sock.getsockname()[1]
    config = uvicorn.Config(
        api.app, log_level="warning", access_log=False, lifespan="off", backlog=4096
    )
    server = uvicorn.Server(config)
    print(f"model API stand-in listening on {api.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    sock.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
