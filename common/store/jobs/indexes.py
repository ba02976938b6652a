"""The jobs collection's indexes (`ensure_indexes` creates them, rebuilding an older spec)."""

from __future__ import annotations

from pymongo import ASCENDING, DESCENDING, IndexModel

from brook.common.store.fields import P, R, W
from brook.common.store.queries import CLAIM_SORT

_PENDING = {"status": P}

INDEXES = [
    # The queue indexes are partial: they hold only pending (or running) jobs, so they stay
    # small however many finished jobs the collection keeps, and a finished job costs them
    # nothing. Claims read them in claim order (best priority, then earliest due), so a
    # claim is an index scan that stops at the first match and never sorts in memory.
    # The general claim order; queue and task ride in the key so that a routed claim that
    # cannot use the two below (too many tasks to merge) filters on index keys alone.
    IndexModel(
        [("status", ASCENDING), *CLAIM_SORT, ("queue", ASCENDING), ("task", ASCENDING)],
        name="claim_order",
        partialFilterExpression=_PENDING,
    ),
    # A dispatcher serving every queue: one scan per task it runs, merged in claim order;
    # jobs of tasks it does not run (however many) cost it nothing.
    IndexModel(
        [("status", ASCENDING), ("task", ASCENDING), *CLAIM_SORT, ("queue", ASCENDING)],
        name="claim_by_task",
        partialFilterExpression=_PENDING,
    ),
    # A dispatcher claiming for one of its queues: one scan per task, in that queue only.
    IndexModel(
        [("status", ASCENDING), ("queue", ASCENDING), ("task", ASCENDING), *CLAIM_SORT],
        name="claim_by_queue",
        partialFilterExpression=_PENDING,
    ),
    # A queue claimed fairly across keys: the best due jobs of one key (jobs without a key
    # under null), and the keys with pending jobs (a distinct scan, one seek per key).
    IndexModel(
        [
            ("status", ASCENDING),
            ("queue", ASCENDING),
            ("key", ASCENDING),
            *CLAIM_SORT,
            ("task", ASCENDING),
        ],
        name="claim_by_key",
        partialFilterExpression=_PENDING,
    ),
    # Next due time among the tasks a dispatcher runs (the dispatcher's timer).
    IndexModel(
        [("status", ASCENDING), ("task", ASCENDING), ("run_at", ASCENDING), ("queue", ASCENDING)],
        name="due",
        partialFilterExpression=_PENDING,
    ),
    # Watchdog: running jobs whose lease expired.
    IndexModel(
        [("status", ASCENDING), ("lease_expires_at", ASCENDING)],
        name="lease_expiry",
        partialFilterExpression={"status": R},
    ),
    # Workflows: the waiting children of a parent (the partial index holds only waiting
    # jobs, so it costs the rest nothing) ...
    IndexModel(
        [("parents_left", ASCENDING)],
        name="waiting_on",
        partialFilterExpression={"status": W},
    ),
    # ... and the parents whose children are not settled yet (the sweep's backstop).
    IndexModel(
        [("status", ASCENDING)],
        name="dependents_unsettled",
        partialFilterExpression={"unsettled": {"$exists": True}},
    ),
    # The jobs held back by a quota, by quota and due time (a released hold wakes them).
    IndexModel(
        [("waiting_for.name", ASCENDING), ("run_at", ASCENDING)],
        name="quota_waiters",
        partialFilterExpression={"status": P, "waiting_for.kind": "quota"},
    ),
    # The jobs waiting for a signal, by key (a signal wakes them: `woken_by_signal`).
    IndexModel(
        [("waiting_for.key", ASCENDING)],
        name="signal_waiters",
        partialFilterExpression={"status": P, "waiting_for.kind": "signal"},
    ),
    # Per-key concurrency held on the jobs (`QueueLimits.slots_on_jobs`): a running job of
    # a key holds one of its slots, `queue:index:key`; no two running jobs hold the same one,
    # and the write that ends the attempt (or requeues it) frees it with the status.
    IndexModel(
        [("key_slot", ASCENDING)],
        name="key_slots",
        unique=True,
        partialFilterExpression={"status": R, "key_slot": {"$type": "string"}},
    ),
    # Listing and search (`GET /jobs`), newest first: `created_at`, then `_id`, end every
    # listing index, so each filter is an equality prefix, `since`/`until` a range on
    # `created_at`, and the index gives the order (no sort). A filter without a value in the
    # prefix is made a list of every value (all statuses, the error types a prefix names),
    # which MongoDB reads as one scan per value merged in order. `created_at` and `_id`
    # never change, so only `status`, where it is in the key, moves an entry on an update.
    IndexModel([("created_at", DESCENDING), ("_id", DESCENDING)], name="list_created"),
    IndexModel(
        [("status", ASCENDING), ("created_at", DESCENDING), ("_id", DESCENDING)],
        name="list_status",
    ),
    IndexModel(
        [("task", ASCENDING), ("created_at", DESCENDING), ("_id", DESCENDING)], name="list_task"
    ),
    # The queue's counts by status (`GET /queues`, `/metrics`) are read from this index alone.
    IndexModel(
        [
            ("queue", ASCENDING),
            ("status", ASCENDING),
            ("created_at", DESCENDING),
            ("_id", DESCENDING),
        ],
        name="list_queue",
    ),
    # Jobs with an error, by type (`GET /jobs?error=`, the retrying jobs of `/failures`); the
    # jobs without one cost it nothing.
    IndexModel(
        [
            ("error.type", ASCENDING),
            ("status", ASCENDING),
            ("created_at", DESCENDING),
            ("_id", DESCENDING),
        ],
        name="errors",
        partialFilterExpression={"error.type": {"$type": "string"}},
    ),
    # An idempotency key is reserved while its job exists (or until its unique window ends).
    IndexModel(
        [("idempotency_key", ASCENDING)],
        name="idempotency_key_unique",
        unique=True,
        partialFilterExpression={"idempotency_key": {"$type": "string"}},
    ),
    # Bulk retry (`POST /jobs/retry`): failed or cancelled jobs by error type and finish time
    # (finished jobs of other statuses cost it nothing) ...
    IndexModel(
        [("status", ASCENDING), ("error.type", ASCENDING), ("finished_at", ASCENDING)],
        name="failures",
        partialFilterExpression={"status": {"$in": ["cancelled", "failed"]}},
    ),
    # ... and jobs by key (a bulk cancel of one tenant's jobs, a listing by key; jobs without
    # a key cost it nothing).
    IndexModel(
        [
            ("key", ASCENDING),
            ("status", ASCENDING),
            ("created_at", DESCENDING),
            ("_id", DESCENDING),
        ],
        name="by_key",
        partialFilterExpression={"key": {"$type": "string"}},
    ),
    # Debounce: one pending job per debounce key (racing submits join it; once claimed, it
    # leaves the index and the next submit starts a new one).
    IndexModel(
        [("debounce_key", ASCENDING)],
        name="debounce_pending",
        unique=True,
        # Only a job its key's submits may still join: one claimed (then retried or handed
        # back to pending) holds its key no more.
        partialFilterExpression={
            "status": P,
            "debounce_key": {"$type": "string"},
            "debounce_open": True,
        },
    ),
    # Spawned jobs (`ctx.submit`), by the job that spawned them, newest first: a cancel goes
    # down the tree by it, and `GET /jobs?spawned_by=` lists them. Jobs no task spawned
    # cost it nothing ...
    IndexModel(
        [("spawned_by", ASCENDING), ("_id", DESCENDING)],
        name="spawned",
        partialFilterExpression={"spawned_by": {"$type": "string"}},
    ),
    # ... and the jobs whose spawned jobs are being cancelled (the sweep's backstop).
    IndexModel(
        [("status", ASCENDING)],
        name="spawn_cancelling",
        partialFilterExpression={"spawn_cancel": True},
    ),
    # Deadlines: the waiting and pending jobs by their own `start_by` and `deadline` (the
    # timer's look for the next bound, and for those passed; the others cost them nothing) ...
    *(
        IndexModel(
            [("status", ASCENDING), (field, ASCENDING)],
            name=field,
            partialFilterExpression={"status": {"$in": [W, P]}, field: {"$type": "date"}},
        )
        for field in ("start_by", "deadline")
    ),
    # ... and by their submit, per task: a bound a task declares counts from it.
    IndexModel(
        [("status", ASCENDING), ("task", ASCENDING), ("created_at", ASCENDING)],
        name="bound_by_age",
        partialFilterExpression={"status": {"$in": [W, P]}},
    ),
    # Retention: a finished job gets `expire_at` (its finish + its retention) at its terminal
    # write, and MongoDB's TTL monitor deletes it then. Active jobs have no `expire_at`.
    IndexModel(
        [("expire_at", ASCENDING)],
        name="retention",
        expireAfterSeconds=0,
        partialFilterExpression={"expire_at": {"$exists": True}},
    ),
]
