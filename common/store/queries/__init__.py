"""Brook's queries on the jobs collection: every state change as a named, pure builder.

Each transition is one function returning a `Write`: the filter that fences it (the status
it expects and, for a running attempt, its owner and attempt number, from `running_fence`)
and the update it applies. Nothing here touches MongoDB: the jobs store runs these, and a
unit test reads them without a database (`tests/unit/common/store/test_queries.py`),
checking each against the allowed transitions in `brook.common.domain.status`. Times come from
the server's clock (`$$NOW`); user data goes in as `$literal`, never read as an expression.

One module per concern, as the jobs store (`brook.common.store.jobs`) has: `base` (the claim
order, `Write`, the fences), `submits`, `claims`, `attempts` (a running attempt's lease,
progress, start and transaction), `steps`, `outcomes`, `commands` (a caller's operations
on one job and on many), `workflows`, `spawned` (a cancel that reaches the jobs a task
submitted), `reruns` (a new job from a finished one's steps) and `deadlines` (a job's end
by its `start_by` or `deadline`); beside them `listing`, the reads that list, search and
group jobs (the index each reads, its filter and order). Every write builder is importable
from here.
"""

from brook.common.store.queries.attempts import (
    held_leases,
    lease_renewed,
    progress_reported,
    started,
    transaction_closed,
    transaction_opened,
)
from brook.common.store.queries.base import (
    CLAIM_FILTER,
    CLAIM_SORT,
    ENDED,
    FOREVER,
    MAX_MERGED_SCANS,
    Update,
    Write,
    claim_filter,
    claim_index,
    expired_fence,
    not_in_transaction,
    running_fence,
    without_unknown_dependents,
)
from brook.common.store.queries.claims import (
    as_read,
    claimed,
    claimed_as_read,
    claimed_of_key,
    claimed_tagged,
    claimed_with_slots,
    slot_taken,
)
from brook.common.store.queries.commands import (
    bulk_index,
    bulk_match,
    cancel_requested,
    cancel_requested_many,
    cancelled,
    cancelled_many,
    retried,
    retried_many,
)
from brook.common.store.queries.deadlines import (
    DEADLINE,
    NEVER_STARTED,
    START_BY,
    bound_of,
    deadline_exceeded,
    held_deadline_exceeded,
    held_start_by_passed,
    start_by_passed,
)
from brook.common.store.queries.outcomes import (
    attempt_failed,
    cancelled_running,
    completed,
    completed_in_transaction,
    completions_by_id,
    released,
    requeued_expired,
)
from brook.common.store.queries.output import (
    FENCE_FIELDS,
    holds,
    output_counted,
)
from brook.common.store.queries.reruns import rerun_job, rerun_linked, rerun_spec
from brook.common.store.queries.spawned import (
    PARENT_CANCELLED,
    spawn_cancel_done,
    spawn_cancel_marked,
    spawned_cancel_requested,
    spawned_cancelled,
)
from brook.common.store.queries.steps import (
    signal_waiters,
    step_entry,
    step_recorded,
    step_recorded_in_transaction,
    steps_grown,
    suspended,
    woken_by_signal,
)
from brook.common.store.queries.submits import (
    debounced,
    key_released,
    new_job_upsert,
    submitted,
)
from brook.common.store.queries.workflows import (
    dependents_attached,
    marked_settled,
    parents_adopted,
    settled,
)

__all__ = [
    "CLAIM_FILTER",
    "CLAIM_SORT",
    "DEADLINE",
    "ENDED",
    "FENCE_FIELDS",
    "FOREVER",
    "MAX_MERGED_SCANS",
    "NEVER_STARTED",
    "PARENT_CANCELLED",
    "START_BY",
    "Update",
    "Write",
    "as_read",
    "attempt_failed",
    "bound_of",
    "bulk_index",
    "bulk_match",
    "cancel_requested",
    "cancel_requested_many",
    "cancelled",
    "cancelled_many",
    "cancelled_running",
    "claim_filter",
    "claim_index",
    "claimed",
    "claimed_as_read",
    "claimed_of_key",
    "claimed_tagged",
    "claimed_with_slots",
    "completed",
    "completed_in_transaction",
    "completions_by_id",
    "deadline_exceeded",
    "debounced",
    "dependents_attached",
    "expired_fence",
    "held_deadline_exceeded",
    "held_leases",
    "held_start_by_passed",
    "holds",
    "key_released",
    "lease_renewed",
    "marked_settled",
    "new_job_upsert",
    "not_in_transaction",
    "output_counted",
    "parents_adopted",
    "progress_reported",
    "released",
    "requeued_expired",
    "rerun_job",
    "rerun_linked",
    "rerun_spec",
    "retried",
    "retried_many",
    "running_fence",
    "settled",
    "signal_waiters",
    "slot_taken",
    "spawn_cancel_done",
    "spawn_cancel_marked",
    "spawned_cancel_requested",
    "spawned_cancelled",
    "start_by_passed",
    "started",
    "step_entry",
    "step_recorded",
    "step_recorded_in_transaction",
    "steps_grown",
    "submitted",
    "suspended",
    "transaction_closed",
    "transaction_opened",
    "without_unknown_dependents",
    "woken_by_signal",
]
