"""The API's front door, before any route: which `Host` it answers to, what a state change
must look like, and the headers every response carries.

- `Host` not among `BROOK_ALLOWED_HOSTS` (by default, on a loopback bind, the loopback
  names): `400`. A page on another site that rebinds its DNS name to 127.0.0.1 sends its
  own name as `Host`, so it cannot reach the API through the victim's browser.
- A state change (any method but GET, HEAD and OPTIONS) with a body, or any content type,
  that is not `application/json`: `415`. So no "simple" cross-site request (a form, a
  `no-cors` fetch: text/plain, form data) can change anything; a JSON one needs a CORS
  preflight, which the API never grants (it sends no CORS headers at all).
- A state change whose `Origin` is another site: `403` (a bodiless cross-site POST, such
  as a cancel, is refused this way). Clients that are not browsers send no `Origin`.
- Every response: `nosniff`, no framing (`frame-ancestors 'none'`, `X-Frame-Options`), no
  referrer, and a Content-Security-Policy: `default-src 'none'` unless the route set its
  own (the dashboard and the API docs do).
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
JSON_TYPE = "application/json"
DEFAULT_CSP = "default-src 'none'; frame-ancestors 'none'"
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def host_name(host: str) -> str:
    """`Host` without its port, lower case (`[::1]:8000` -> `[::1]`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _same_origin(origin: str, host: str) -> bool:
    try:
        netloc = urlsplit(origin).netloc.lower()
    except ValueError:
        return False
    return bool(netloc) and netloc == host.strip().lower()


def _has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in headers


class Guard:
    """Pure ASGI: no task per request, and event streams pass through untouched."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts  # None: any

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await _answer(send, *refusal)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
                headers.setdefault("Content-Security-Policy", DEFAULT_CSP)
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return 400, "this API does not answer to that Host (see BROOK_ALLOWED_HOSTS)"
        if scope["method"] in SAFE_METHODS:
            return None
        content_type = headers.get("content-type")
        media = (content_type or "").split(";", 1)[0].strip().lower()
        if (content_type is not None or _has_body(headers)) and media != JSON_TYPE:
            return 415, f"a request body must be {JSON_TYPE}"
        origin = headers.get("origin")
        if origin is not None and not _same_origin(origin, host):
            return 403, "a state change from another site's page is refused"
        return None


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", JSON_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()),
        (b"content-security-policy", DEFAULT_CSP.encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
