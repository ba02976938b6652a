"""Brook's named write builders (`brook.common.store.queries`), read without a database: each
fences on the status it expects (and a running attempt's owner and attempt number), and
every status it writes is an allowed transition of `brook.common.domain.status`."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from brook.common.domain.deadlines import TaskDeadlines
from brook.common.domain.models import JobSpec
from brook.common.domain.status import ALLOWED, TERMINAL, JobStatus
from brook.common.store import queries
from brook.common.store.pipelines import (
    DISPATCHER_PIPELINE,
    INVALIDATING,
    LEAN_PIPELINE,
    LIVE_PIPELINE,
    job_status_pipeline,
)
from brook.common.store.queries import Write
from brook.common.store.records import EndedParent, ExpiredLease, Lease, RunTimes

OWNER = "dispatcher-1"
LEASE = Lease(job_id="j1", attempt=3)
KNOWING = Lease(job_id="j2", attempt=4, has_dependents=True)
EXPIRED = ExpiredLease(job_id="j1", attempt=3, task="noop", owner=OWNER)
AT = datetime(2026, 1, 1, tzinfo=UTC)
RAN = RunTimes(started_at=AT, finished_at=AT)
ERROR = {"type": "ValueError", "message": "bad"}
ENDED = [
    EndedParent(job_id="p1", status=JobStatus.COMPLETED, token="t1"),
    EndedParent(job_id="p2", status=JobStatus.FAILED, token="t2"),
]
STATUSES = {s.value for s in JobStatus}
BY_TASK = {"slow": TaskDeadlines(start_within_s=5, deadline_s=60)}


def _running(write: Write, lease: Lease = LEASE, owner: str = OWNER) -> None:
    """The fence of every write of a running attempt."""
    assert write.filter["_id"] == lease.job_id
    assert write.filter["attempts"] == lease.attempt
    assert write.filter["owner"] == owner
    assert write.filter["status"] == JobStatus.RUNNING.value


# Every builder: (the write, the statuses it may find, the statuses it may write).
R, P, W = JobStatus.RUNNING, JobStatus.PENDING, JobStatus.WAITING
C, F, D = JobStatus.CANCELLED, JobStatus.FAILED, JobStatus.COMPLETED
CASES: dict[str, tuple[Write, set[JobStatus], set[JobStatus]]] = {
    "submitted": (queries.submitted("j1", JobSpec(task="noop", payload={})), set(), {P}),
    "key_released": (queries.key_released("j1", "k"), set(), set()),
    "debounced": (
        queries.debounced(
            "j1", JobSpec(task="noop", payload={"n": 1}, debounce_key="doc-7", debounce_s=2)
        ),
        {P},
        {P},
    ),
    "claimed": (queries.claimed(OWNER, 30, tasks={"noop"}), {P}, {R}),
    "claimed_as_read": (
        queries.claimed_as_read([{"_id": "j1", "attempts": 2}], OWNER, 30, "tag"),
        {P},
        {R},
    ),
    "claimed_of_key": (queries.claimed_of_key(OWNER, 30, "q", "k", {"noop"}), {P}, {R}),
    "claimed_tagged": (queries.claimed_tagged(["j1", "j2"], OWNER, 30, "tag", AT), {P}, {R}),
    "claimed_with_slots": (
        queries.claimed_with_slots({"j1": "q:0:k", "j2": None}, OWNER, 30, "tag"),
        {P},
        {R},
    ),
    "slot_taken": (queries.slot_taken(OWNER, "j1", 3, "q:0:k"), {R}, set()),
    "lease_renewed": (queries.lease_renewed(OWNER, [LEASE, KNOWING], 30), {R}, set()),
    "progress_reported": (queries.progress_reported(LEASE, OWNER, 0.5, "half"), {R}, set()),
    "output_counted": (queries.output_counted(LEASE, OWNER, 4, 10), {R}, set()),
    "started": (queries.started(LEASE, OWNER, AT), {R}, set()),
    "transaction_opened": (queries.transaction_opened(LEASE, OWNER, {"id": 1}, 30), {R}, set()),
    "transaction_closed": (queries.transaction_closed(LEASE, OWNER, 30), {R}, set()),
    "completed": (queries.completed(LEASE, OWNER, {"ok": 1}, 60, RAN), {R}, {D}),
    "completions_by_id": (
        queries.completions_by_id(OWNER, [(LEASE, 1), (KNOWING, 2)], 60, {}),
        {R},
        {D},
    ),
    "completed_in_transaction": (
        queries.completed_in_transaction(LEASE, OWNER, 1, 60, {"fraction": 1.0}),
        {R},
        {D},
    ),
    "attempt_failed": (queries.attempt_failed(LEASE, OWNER, ERROR, 1.0, 60), {R}, {P, F, C}),
    "requeued_expired": (queries.requeued_expired(EXPIRED, 1.0, 60), {R}, {P, F, C}),
    "cancelled_running": (queries.cancelled_running(LEASE, OWNER, 60, RAN), {R}, {C}),
    "released": (queries.released(LEASE, OWNER, 60), {R}, {P, C}),
    "cancelled": (queries.cancelled("j1", 60), {W, P}, {C}),
    "cancel_requested": (queries.cancel_requested("j1"), {R}, set()),
    "retried": (queries.retried("j1"), {F, C}, {P}),
    "retried_many": (queries.retried_many(["j1", "j2"], "op"), {F, C}, {P}),
    "cancelled_many": (queries.cancelled_many(["j1", "j2"], 60, "op"), {W, P}, {C}),
    "cancel_requested_many": (queries.cancel_requested_many(["j1"], "op"), {R}, set()),
    "dependents_attached": (queries.dependents_attached(["p1"], "tok"), set(), set()),
    "parents_adopted": (queries.parents_adopted({"new": "old"}), {W}, set()),
    "settled": (queries.settled(["c1"], ENDED, "tag", 60), {W}, {P, C, W}),
    "marked_settled": (queries.marked_settled(ENDED[0], 60), set(TERMINAL), set()),
    "step_recorded": (queries.step_recorded(LEASE, OWNER, "s", {"v": 1}, 20, 1.5), {R}, set()),
    "step_recorded_in_transaction": (
        queries.step_recorded_in_transaction(LEASE, OWNER, "s", 1, 20, 1.5),
        {R},
        set(),
    ),
    "suspended": (
        queries.suspended(LEASE, OWNER, AT, {"kind": "sleep", "step": "sleep#1"}, 60),
        {R},
        {P, C},
    ),
    "woken_by_signal": (queries.woken_by_signal("k"), {P}, set()),
    "spawn_cancel_marked": (queries.spawn_cancel_marked(["j1"]), set(), set()),
    "spawned_cancelled": (queries.spawned_cancelled(["j1", "j2"], 60, "op"), {W, P}, {C}),
    "spawned_cancel_requested": (queries.spawned_cancel_requested(["j1"], "op"), {R}, set()),
    "spawn_cancel_done": (queries.spawn_cancel_done(["j1"]), set(TERMINAL), set()),
    "rerun_linked": (queries.rerun_linked("j1", "j2"), set(TERMINAL), set()),
    "start_by_passed": (queries.start_by_passed("j1", BY_TASK, 60), {W, P}, {C}),
    "deadline_exceeded": (queries.deadline_exceeded("j1", BY_TASK, 60), {W, P}, {F}),
    "held_start_by_passed": (queries.held_start_by_passed(LEASE, OWNER, AT, 60), {R}, {C}),
    "held_deadline_exceeded": (
        queries.held_deadline_exceeded(LEASE, OWNER, AT, 60, RAN),
        {R},
        {P, C, F},
    ),
}


def _literals(expr: Any) -> Iterator[str]:
    """The status names an expression can evaluate to (its string literals that name one;
    field paths such as `$status` are not literals)."""
    if isinstance(expr, str):
        if expr in STATUSES:
            yield expr
    elif isinstance(expr, dict):
        for value in expr.values():
            yield from _literals(value)
    elif isinstance(expr, list):
        for value in expr:
            yield from _literals(value)


def written(write: Write) -> set[JobStatus]:
    """The statuses a write may set (`status` in any `$set` of its update)."""
    stages = write.update if isinstance(write.update, list) else [write.update]
    out: set[JobStatus] = set()
    for stage in stages:
        fields = stage.get("$set", {})
        if "status" in fields:
            out |= {JobStatus(s) for s in _literals(fields["status"])}
    return out


def expected(write: Write) -> set[JobStatus]:
    """The statuses a write's filter lets it find (none named: any)."""
    status = write.filter.get("status")
    if status is None:
        return set()
    if isinstance(status, str):
        return {JobStatus(status)}
    return {JobStatus(s) for s in status["$in"]}


def test_every_named_write_builder_is_read_here() -> None:
    builders = {
        name
        for name, fn in inspect.getmembers(queries, inspect.isfunction)
        if fn.__module__.startswith(f"{queries.__name__}.")
        and not name.startswith("_")
        and inspect.signature(fn).return_annotation in ("Write", Write)
    }
    assert builders == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_write_fences_on_the_status_it_expects(name: str) -> None:
    write, finds, _ = CASES[name]
    assert expected(write) == finds


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_write_sets_only_statuses_it_may_move_to(name: str) -> None:
    write, finds, sets = CASES[name]
    assert written(write) == sets
    for src in finds:
        for dst in sets - {src}:
            assert (src, dst) in ALLOWED, f"{name}: {src} -> {dst}"


@pytest.mark.parametrize(
    "name",
    sorted(n for n, (_, finds, _) in CASES.items() if finds == {JobStatus.RUNNING}),
)
def test_every_write_of_a_running_attempt_names_its_owner_and_attempt(name: str) -> None:
    write = CASES[name][0]
    if name == "lease_renewed":
        assert write.filter["owner"] == OWNER and write.filter["status"] == "running"
        assert [(c["_id"], c["attempts"]) for c in write.filter["$or"]] == [("j1", 3), ("j2", 4)]
    elif name == "completions_by_id":
        assert write.filter["owner"] == OWNER and write.filter["status"] == "running"
        assert write.filter["_id"] == {"$in": ["j1", "j2"]}
        assert "$attempts" in str(write.filter["$expr"])  # attempts 3 and 4, one per job
    elif name == "requeued_expired":
        _running(write, LEASE, EXPIRED.owner)
        assert write.filter["$expr"] == {"$lt": ["$lease_expires_at", "$$NOW"]}
    elif name == "cancel_requested":
        assert write.filter == {"_id": "j1", "status": "running"}  # a caller's, not the holder's
    elif name in ("cancel_requested_many", "spawned_cancel_requested"):  # a caller's, many
        assert write.filter == {
            "_id": {"$in": ["j1"]},
            "status": "running",
            "cancel_requested": {"$ne": True},
        }
    else:
        _running(write)


def test_a_bulk_filter_puts_user_values_in_as_equalities_and_cancels_each_running_job_once() -> None:
    from brook.common.domain.bulk import JobFilter

    f = JobFilter(task="$where", key="acme", error_type="E", finished_since=AT)
    retry = queries.bulk_match(f, "retry")
    assert retry == {
        "status": {"$in": ["cancelled", "failed"]},
        "task": {"$eq": "$where"},
        "key": {"$eq": "acme", "$type": "string"},
        "error.type": {"$eq": "E"},
        "finished_at": {"$gte": AT},
    }
    cancel = queries.bulk_match(JobFilter(status=[P, C]), "cancel")
    assert cancel == {"status": {"$in": ["pending"]}, "cancel_requested": {"$ne": True}}


def test_a_completion_that_does_not_know_of_dependents_is_fenced_on_there_being_none() -> None:
    assert queries.completed(LEASE, OWNER, 1, 60).filter["has_dependents"] == {"$ne": True}
    assert "has_dependents" not in queries.completed(KNOWING, OWNER, 1, 60).filter
    one = queries.completions_by_id(OWNER, [(LEASE, 1)], 60, {})
    assert one.filter == {
        "_id": {"$in": ["j1"]},
        "owner": OWNER,
        "status": "running",
        "attempts": 3,
        "has_dependents": {"$ne": True},
    }


def test_progress_starts_and_heartbeats_pass_an_attempts_own_transaction_by() -> None:
    for write in (
        queries.progress_reported(LEASE, OWNER, 0.1, None),
        queries.started(LEASE, OWNER, AT),
    ):
        assert write.filter["tx.attempt"] == {"$ne": LEASE.attempt}
    renewed = queries.lease_renewed(OWNER, [LEASE], 30)
    assert renewed.filter["$or"] == [{"_id": "j1", "attempts": 3, "tx.attempt": {"$ne": 3}}]


def test_a_claim_as_read_takes_each_job_only_unchanged_since_its_read() -> None:
    """A batch claim that wins every job as read uses what it read (no read-back): each job
    is fenced on its attempt number and on what a debounced join or a signal moves."""
    read = {"_id": "j1", "attempts": 2, "debounced": 3, "updated_at": AT, "payload": {}}
    fence = {"_id": "j1", "attempts": 2, "debounced": 3, "updated_at": AT}
    assert queries.as_read(read) == fence
    fresh = queries.as_read({"_id": "j2", "attempts": 0})
    assert fresh["debounced"] is None and fresh["updated_at"] is None  # null: field absent
    assert queries.claimed_as_read([read], OWNER, 30, "t").filter["$or"] == [fence]


def test_user_data_goes_in_as_literals_never_as_expressions() -> None:
    write = queries.completed(LEASE, OWNER, {"$where": "$status"}, 60)
    assert isinstance(write.update, list)
    assert write.update[0]["$set"]["result"] == {"$literal": {"$where": "$status"}}
    claimed = queries.claimed(OWNER, 30)
    assert isinstance(claimed.update, list)
    assert claimed.update[0]["$set"]["owner"] == {"$literal": OWNER}


def test_every_stream_of_the_jobs_collection_ends_on_an_invalidating_event() -> None:
    for pipeline in (DISPATCHER_PIPELINE, LIVE_PIPELINE, LEAN_PIPELINE, job_status_pipeline("j")):
        assert all(op in str(pipeline[0]["$match"]) for op in INVALIDATING)


# -- durable steps -------------------------------------------------------------------------


def test_a_step_is_recorded_once_per_name_fenced_like_a_completion_and_never_into_a_tx() -> None:
    write = queries.step_recorded(LEASE, OWNER, "fetch", {"$where": "x"}, 20, 1.5)
    _running(write)
    assert write.filter["steps.name"] == {"$ne": "fetch"}
    assert write.filter["tx.attempt"] == {"$ne": LEASE.attempt}
    entry = write.update[0]["$set"]["steps"]["$concatArrays"][1][0]  # type: ignore[index]
    assert entry["name"] == {"$literal": "fetch"}
    assert entry["result"] == {"$literal": {"$where": "x"}}  # user data, never an expression
    assert entry["attempt"] == LEASE.attempt and entry["size"] == 20


def test_a_transactional_steps_checkpoint_is_fenced_by_attempt_and_owner() -> None:
    write = queries.step_recorded_in_transaction(LEASE, OWNER, "reserve", 1, 20, 1.0)
    _running(write)
    assert write.filter["steps.name"] == {"$ne": "reserve"}


def test_a_suspension_is_neither_an_attempt_nor_a_failure_and_a_cancel_asked_wins() -> None:
    write = queries.suspended(LEASE, OWNER, AT, {"kind": "sleep", "step": "sleep#1"}, 60)
    fields = write.update[0]["$set"]  # type: ignore[index]
    assert "attempts" not in fields  # the attempt number goes on: it is the fencing token
    grown = fields["max_attempts"]["$cond"][2]
    assert grown == {"$add": ["$max_attempts", 1]}
    assert fields["run_at"]["$cond"][2] == {"$literal": AT}
    assert fields["status"] == {"$cond": [{"$eq": ["$cancel_requested", True]}, "cancelled", "pending"]}
    forever = queries.suspended(LEASE, OWNER, None, {"kind": "signal", "key": "k"}, 60)
    due = forever.update[0]["$set"]["run_at"]["$cond"][2]  # type: ignore[index]
    assert due == {"$literal": queries.FOREVER}


def test_a_signal_wakes_only_pending_jobs_waiting_on_its_key_and_the_stream_hears_it() -> None:
    write = queries.woken_by_signal("order:1")
    assert write.filter == {
        "status": "pending",
        "waiting_for.kind": "signal",
        "waiting_for.key": "order:1",
    }
    assert write.update[0]["$set"]["run_at"] == "$$NOW"  # type: ignore[index]
    assert "woken_at" in write.update[0]["$set"]  # type: ignore[index]
    matches = DISPATCHER_PIPELINE[0]["$match"]["$or"]
    assert {
        "operationType": "update",
        "updateDescription.updatedFields.woken_at": {"$exists": True},
    } in matches


def test_an_outputs_count_is_written_by_the_holding_attempt_and_never_lowered() -> None:
    write = queries.output_counted(LEASE, OWNER, 4, 10)
    assert write.filter["tx.attempt"] == {"$ne": LEASE.attempt}
    assert write.update == {"$max": {"output.chunks": 4, "output.bytes": 10}}


def test_a_batch_is_read_against_the_same_fence_a_running_attempts_write_has() -> None:
    held = {"attempts": LEASE.attempt, "owner": OWNER, "status": R}
    assert queries.holds(held, LEASE, OWNER)
    assert not queries.holds(None, LEASE, OWNER)
    assert not queries.holds({**held, "owner": "another"}, LEASE, OWNER)
    assert not queries.holds({**held, "attempts": LEASE.attempt + 1}, LEASE, OWNER)
    assert not queries.holds({**held, "status": "pending"}, LEASE, OWNER)
    assert set(queries.FENCE_FIELDS) >= set(queries.running_fence(LEASE, OWNER)) - {"_id"}
