"""structlog: one JSON object per line on stdout, in every process (API, dispatcher, workers).

Stdlib loggers (uvicorn, pymongo, asyncio) go through the same renderer, so a reader or a
log shipper sees a single format.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import date
from typing import Any

import structlog

_SHARED: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def _add_process(_: Any, __: str, event_dict: structlog.types.EventDict) -> Any:
    event_dict.setdefault("pid", os.getpid())
    event_dict.pop("color_message", None)  # uvicorn's ANSI duplicate of `event`
    return event_dict


def _json_default(value: Any) -> Any:
    """What a line's value JSON cannot carry: a time as ISO 8601 (as every other time in the
    logs is written), anything else as its repr."""
    if isinstance(value, date):
        return value.isoformat()
    return repr(value)


# The level `configure_logging` set (None: never configured, everything goes through).
_threshold: int | None = None


def enabled(level: int) -> bool:
    """Whether a line at `level` would be written: callers on a hot path skip building it."""
    return _threshold is None or level >= _threshold


def configure_logging(level: str = "INFO", *, role: str | None = None) -> None:
    """Configure structlog and the stdlib root logger; safe to call again (e.g. in a child)."""
    global _threshold
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    _threshold = numeric
    renderer = structlog.processors.JSONRenderer(sort_keys=False, default=_json_default)
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_SHARED, structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _add_process,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for noisy in ("pymongo", "pymongo.serverSelection", "pymongo.connection", "pymongo.command"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").setLevel(max(numeric, logging.WARNING))

    structlog.configure(
        processors=[
            *_SHARED,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    if role is not None:
        structlog.contextvars.bind_contextvars(role=role)


def get_logger(**bound: Any) -> Any:
    """A lazy logger: it follows `configure_logging` even when created before it."""
    logger = structlog.get_logger("brook")
    return logger.new(**bound) if bound else logger
