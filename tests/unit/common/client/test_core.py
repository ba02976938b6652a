"""The client's operations, without a database: what a submit logs."""

from __future__ import annotations

from datetime import UTC, datetime

from brook.common.domain.models import Job


def job(job_id: str, queue: str) -> Job:
    now = datetime.now(UTC)
    return Job.from_doc(
        {"_id": job_id, "task": "noop", "status": "pending", "queue": queue, "run_at": now,
         "created_at": now, "attempts": 0}
    )


def test_a_state_change_is_logged_with_who_asked_for_it() -> None:
    from structlog.testing import capture_logs

    from brook.common.client.core import log_submitted
    from brook.common.runtime.log_events import requested_by
    from brook.common.store.jobs import Submitted

    submitted = Submitted(job=job("j1", "default"), created=True)
    with capture_logs() as logs:
        log_submitted(submitted)  # outside the API: the Python client (or a task's ctx)
        token = requested_by.set("read")
        try:
            log_submitted(submitted)
        finally:
            requested_by.reset(token)
    assert [line["by"] for line in logs] == ["python-client", "read"]
