"""What every role shares, in rooms: `domain` (the job and its rules), `store` (all MongoDB
access), `client` (the client's operations, written once), `runtime` (process plumbing)
and `protocol` (the dispatcher↔worker contract). `ingest`, `dispatcher` and `executor`
depend on these, never on each other."""

import sys as _sys

if "structlog" not in _sys.modules and "rich" not in _sys.modules:
    # structlog imports `rich`, when it is installed (the CLI's progress bar uses it), for the
    # tracebacks of its console renderer; Brook logs JSON only (`brook.common.runtime.log`).
    # Keeping rich out of that first import saves every process (API, dispatcher, forkserver, CLI)
    # about 0.1 CPU-s of its start; rich still imports normally afterwards.
    _sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog  # noqa: F401
    finally:
        del _sys.modules["rich"]
