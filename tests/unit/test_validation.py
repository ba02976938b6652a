"""The shared job-spec validator, the queue setting, the status table, the blocking forms of
the client's operations, and per-queue claiming, without a database."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

import pytest

from common.domain.errors import InvalidInput
from common.domain.models import Job
from common.domain.status import ALLOWED, RETRIES, TERMINAL, TRANSITIONS, JobStatus
from common.domain.validation import check_document, validate_batch, validate_spec
from common.runtime.blocking import Coro, LoopThread, T, blocking, delegating
from common.runtime.settings import Settings, parse_queues
from common.runtime.supervision import spawn_logged
from common.store.clock import ServerClock
from dispatcher.claimer import Claimer
from dispatcher.held_jobs import Holdings
from dispatcher.limits import Limits
from dispatcher.wiring import Wiring
from ingest.validation import parse_batch, parse_submit


def detail(data: object, *, batch: bool = False) -> Any:
    with pytest.raises(InvalidInput) as info:
        validate_batch(data) if batch else validate_spec(data)
    return info.value.detail


def test_a_spec_gets_the_contract_defaults() -> None:
    spec = validate_spec({"task": "noop"})
    assert (spec.queue, spec.priority, spec.max_attempts, spec.payload) == ("default", 0, 3, {})
    assert spec.run_at is None and spec.delay_s is None and spec.retention_s is None


def test_run_at_is_normalised_to_utc_milliseconds_and_excludes_delay() -> None:
    spec = validate_spec({"task": "noop", "run_at": "2030-01-01T12:00:00.123456+02:00"})
    assert spec.run_at == datetime(2030, 1, 1, 10, 0, 0, 123000, tzinfo=UTC)
    assert detail({"task": "noop", "run_at": "2030-01-01T00:00:00Z", "delay": 1}) == [
        {"loc": [], "msg": "Value error, give run_at or delay, not both", "type": "value_error"}
    ]


@pytest.mark.parametrize("queue", ["default", "emails", "a.b-c_1", "Q" * 64])
def test_queue_names_may_use_letters_digits_dots_dashes_and_underscores(queue: str) -> None:
    assert validate_spec({"task": "noop", "queue": queue}).queue == queue


@pytest.mark.parametrize("queue", ["", "has space", "a:b", "a,b", "-lead", "Q" * 65, 7])
def test_other_queue_names_are_refused(queue: object) -> None:
    [error] = detail({"task": "noop", "queue": queue})
    assert error["loc"] == ["queue"]


def test_unique_for_s_needs_an_idempotency_key() -> None:
    [error] = detail({"task": "noop", "unique_for_s": 10})
    assert error["msg"] == "Value error, unique_for_s needs an idempotency_key"
    spec = validate_spec({"task": "noop", "unique_for_s": 10, "idempotency_key": "k"})
    assert spec.unique_for_s == 10


def test_depends_on_takes_parent_names_each_once() -> None:
    spec = validate_spec({"task": "noop", "depends_on": ["a", "b", "a"]})
    assert spec.depends_on == ("a", "b") and not spec.run_on_parent_failure
    assert validate_spec({"task": "noop", "depends_on": []}).depends_on == ()
    [error] = detail({"task": "noop", "depends_on": [""]})
    assert error["loc"] == ["depends_on", 0]
    [error] = detail({"task": "noop", "run_on_parent_failure": "yes"})
    assert error["loc"] == ["run_on_parent_failure"]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"n": 2**63}, "payload.n: integer does not fit in 64 bits"),
        ({"when": datetime.now(UTC)}, "payload.when: a datetime is not a JSON value"),
        ({"s": {1, 2}}, "payload.s: a set is not a JSON value"),
        ({1: "x"}, "payload: key 1 is not a string"),
        ({"x": float("nan")}, "payload.x: nan is not a JSON number"),
    ],
)
def test_python_payloads_must_be_json_that_bson_can_store(
    payload: dict[Any, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_document(payload)


def test_tuples_are_json_arrays_and_big_but_valid_ints_pass() -> None:
    check_document({"t": (1, 2), "n": -(2**63), "m": 2**63 - 1, "f": 1.5, "b": True, "z": None})


def test_a_batch_names_the_index_of_each_bad_spec_and_holds_1_to_1000_specs() -> None:
    errors = detail({"jobs": [{"task": "noop"}, {"task": "noop", "priority": "x"}]}, batch=True)
    assert [e["loc"] for e in errors] == [["jobs", 1, "priority"]]
    assert detail({"jobs": [{"task": "noop"}, 5]}, batch=True)[0]["loc"] == ["jobs", 1]
    assert detail({"jobs": []}, batch=True)[0]["loc"] == ["jobs"]
    assert detail({"jobs": [{"task": "noop"}] * 1001}, batch=True)[0]["loc"] == ["jobs"]
    assert detail({"jobs": [], "more": 1}, batch=True)
    assert detail([1], batch=True) == "body must be a JSON object"
    assert len(validate_batch({"jobs": [{"task": "noop"}] * 1000})) == 1000


def test_http_bodies_are_judged_by_the_same_validator() -> None:
    assert parse_submit(b'{"task": "noop", "queue": "q"}').queue == "q"
    assert [s.task for s in parse_batch(b'{"jobs": [{"task": "a"}, {"task": "b"}]}')] == ["a", "b"]
    deep = b'{"task": "noop", "payload": ' + b'{"a": ' * 33 + b"1" + b"}" * 33 + b"}"
    with pytest.raises(InvalidInput) as info:
        parse_submit(deep)
    assert "payload.a" in str(info.value) and "nesting deeper than 32" in str(info.value)
    with pytest.raises(InvalidInput, match="body: nesting deeper than 32"):
        parse_submit(b"[" * 5000 + b"]" * 5000)


def test_invalid_input_reads_as_one_line() -> None:
    error = InvalidInput([{"loc": ["jobs", 3, "priority"], "msg": "bad", "type": "t"}])
    assert str(error) == "jobs.3.priority: bad"
    assert str(InvalidInput("unknown task 'x'")) == "unknown task 'x'"


def test_brook_queues_parses_names_and_slots() -> None:
    assert parse_queues("default:8, emails:2") == {"default": 8, "emails": 2}
    assert parse_queues(" ") is None
    for bad in ("default", "a:0", "a:-1", "a b:1", "a:1,a:2"):
        with pytest.raises(ValueError):
            parse_queues(bad)
    settings = Settings(queues="default:3,emails:2", concurrency=9)  # type: ignore[arg-type]
    assert settings.worker_slots == 5 and Settings(concurrency=4).worker_slots == 4


def test_only_a_retry_leaves_a_terminal_status_and_only_for_failed_or_cancelled() -> None:
    assert not any(src in TERMINAL for src, _ in TRANSITIONS)
    assert {
        (JobStatus.FAILED, JobStatus.PENDING),
        (JobStatus.CANCELLED, JobStatus.PENDING),
        (JobStatus.FAILED, JobStatus.WAITING),  # a workflow job whose parents did not complete
        (JobStatus.CANCELLED, JobStatus.WAITING),
    } == RETRIES
    assert ALLOWED == TRANSITIONS | RETRIES


# -- blocking and delegating forms ------------------------------------------------------------


class Core:
    def __init__(self) -> None:
        self.threads: list[str] = []

    async def double(self, n: int, *, plus: int = 0) -> int:
        """Twice `n`, plus `plus`."""
        self.threads.append(threading.current_thread().name)
        await asyncio.sleep(0)
        return 2 * n + plus


class Blocking:
    double = blocking(Core.double)

    def __init__(self) -> None:
        self.core = Core()
        self.thread = LoopThread("unit-loop")

    def _target(self) -> Core:
        return self.core

    def _block(self, coro: Coro[T]) -> T:
        return self.thread.run(coro)


class Delegating:
    double = delegating(Core.double)

    def __init__(self) -> None:
        self.core = Core()

    def _target(self) -> Core:
        return self.core


def test_a_blocking_form_runs_the_coroutine_on_its_loop_thread_with_the_same_signature() -> None:
    host = Blocking()
    try:
        assert host.double(3, plus=1) == 7
        assert host.core.threads == ["unit-loop"]
        assert Blocking.double.fn is Core.double and host.double.__doc__ == "Twice `n`, plus `plus`."
    finally:
        host.thread.stop()
    with pytest.raises(RuntimeError, match="not running"):
        host.double(1)  # after close: an error, never a hang


async def test_a_delegating_form_awaits_the_target_and_a_blocking_call_on_its_own_loop_fails() -> None:
    assert await Delegating().double(2) == 4
    thread = LoopThread("unit-loop-2")
    try:
        with pytest.raises(RuntimeError, match="never return"):
            asyncio.run_coroutine_threadsafe(_block_on_own_loop(thread), thread.loop).result()
    finally:
        thread.stop()


async def _block_on_own_loop(thread: LoopThread) -> int:
    return thread.run(Core().double(1))


# -- per-queue claiming ------------------------------------------------------------------------


def job(job_id: str, queue: str) -> Job:
    now = datetime.now(UTC)
    return Job.from_doc(
        {"_id": job_id, "task": "noop", "status": "running", "queue": queue, "run_at": now,
         "created_at": now, "attempts": 1}
    )


class FakeStore:
    def __init__(self, backlog: dict[str, list[str]]) -> None:
        self.backlog = backlog
        self.claims: list[str | None] = []

    async def claim(
        self,
        owner: str,
        lease: float,
        *,
        tasks: Collection[str],
        queue: str | None,
        **_: Any,
    ) -> Job | None:
        self.claims.append(queue)
        ids = self.backlog.get(queue or "", [])
        return job(ids.pop(0), queue or "") if ids else None

    async def claim_many(
        self,
        owner: str,
        lease: float,
        limit: int,
        *,
        tasks: Collection[str],
        queue: str | None,
        **_: Any,
    ) -> tuple[list[Job], bool]:
        got = [j for j in [await self.claim(owner, lease, tasks=tasks, queue=queue)] if j]
        return got, len(got) < limit

    async def next_due(self, **_: Any) -> None:
        return None


async def test_a_queue_that_filled_its_slots_is_claimed_again_when_one_frees_up() -> None:
    store = FakeStore({"default": ["d1", "d2", "d3"], "emails": []})
    holdings = Holdings()
    started: list[str] = []

    def start(claimed: Job) -> None:
        holdings.add(claimed)
        started.append(claimed.id)

    settings = Settings(queues="default:1,emails:2")  # type: ignore[arg-type]
    clock = ServerClock(store)  # type: ignore[arg-type]
    wiring = Wiring(
        settings=settings,
        store=store,  # type: ignore[arg-type]
        owner="me",
        name="me",
        tasks=frozenset({"noop"}),
        holdings=holdings,
        clock=clock,
        spawn=spawn_logged,
    )
    no_limits = Limits(wiring, None)  # type: ignore[arg-type]
    claimer = Claimer(wiring, start, no_limits)
    loop = asyncio.create_task(claimer.run())
    claimer.signal()
    await asyncio.sleep(0.05)
    assert started == ["d1"] and store.claims.count("emails") == 1  # emails: dry, once
    for expected in ("d2", "d3"):
        holdings.drop(started[-1])
        claimer.slot_freed()  # no new event: only a freed slot of the queue that had more
        await asyncio.sleep(0.05)
        assert started[-1] == expected
    assert store.claims.count("emails") == 1  # a dry queue is not asked again without news
    claimer.stop()
    await loop
