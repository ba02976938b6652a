"""`brook api` with a live-event hub that crashes at once (a stand-in for a bug in it)."""

from __future__ import annotations

import sys
from typing import Any

import brook.ingest.live
from brook.cli import main


async def _crash(self: brook.ingest.live.Hub, backoff: Any) -> None:
    raise RuntimeError("a bug in the hub")


if __name__ == "__main__":
    brook.ingest.live.Hub._follow = _crash  # type: ignore[method-assign]
    sys.exit(main(["api"]))
