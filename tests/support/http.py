"""One TLS context for every HTTP client the tests make.

httpx builds a new `ssl.SSLContext` for each client it makes, `httpx.get(...)` included, and
loading the CA bundle into it costs about 35 CPU-ms, though the tests only ever speak plain
HTTP to a local API. A test that polls `/healthz` every 50 ms while an API starts, or the
fuzz run's client per case, spent most of its CPU there: they pass `verify=TLS` instead.
"""

from __future__ import annotations

import ssl

import certifi

TLS = ssl.create_default_context(cafile=certifi.where())
