"""Tasks for durable-execution tests: steps that write effect rows, sleeps, signal waits."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.synchronous.client_session import ClientSession

from brook import SignalTimeout, SyncTaskContext, TaskContext, task


@task("five_steps")
async def five_steps(payload: dict[str, Any], ctx: TaskContext) -> list[int]:
    """Five steps, each inserting one row in `effects`; on attempt 1, step `hold_in` waits
    `hold` seconds before its insert (a test kills something meanwhile)."""
    effects = ctx.database()["effects"]

    async def effect(n: int) -> int:
        if ctx.attempt == 1 and n == payload.get("hold_in"):
            ctx.log.info("step.holding", step=n)
            await asyncio.sleep(float(payload.get("hold", 60)))
        await effects.insert_one({"job_id": ctx.job_id, "step": n, "attempt": ctx.attempt})
        return n

    return [await ctx.step(f"step-{n}", effect, n) for n in range(1, 6)]


@task("sync_steps")
def sync_steps(payload: dict[str, Any], ctx: SyncTaskContext) -> list[Any]:
    """Plain `def` steps; step 2 raises on attempt 1."""
    effects = ctx.database()["effects"]

    def effect(n: int) -> dict[str, int]:
        effects.insert_one({"job_id": ctx.job_id, "step": n, "attempt": ctx.attempt})
        if n == 2 and ctx.attempt == 1:
            raise RuntimeError("step two fails once")
        return {"n": n, "attempt": ctx.attempt}

    return [ctx.step(f"s{n}", effect, n) for n in (1, 2, 3)]


@task("step_misuse")
async def step_misuse(payload: dict[str, Any], ctx: TaskContext) -> str:
    what = payload.get("what")
    if what == "duplicate":
        await ctx.step("same", lambda: 1)
        await ctx.step("same", lambda: 2)
    if what == "too_large":
        await ctx.step("big", lambda: "x" * (2 * 1024 * 1024))
    if what == "not_bson":
        await ctx.step("odd", lambda: object())
    return "unreachable"


@task("tx_steps")
async def tx_steps(payload: dict[str, Any], ctx: TaskContext) -> list[Any]:
    """Three transactional steps, each inserting `rows` rows in `orders` with the step's
    session; on attempt 1 step `hold_in` waits `hold` seconds inside its transaction."""
    orders = ctx.database()["orders"]

    async def write(session: AsyncClientSession, n: int) -> int:
        rows = [
            {"job_id": ctx.job_id, "step": n, "i": i} for i in range(int(payload.get("rows", 3)))
        ]
        await orders.insert_many(rows, session=session)
        if ctx.attempt == 1 and n == payload.get("hold_in"):
            ctx.log.info("step.holding", step=n)
            await asyncio.sleep(float(payload.get("hold", 60)))
        return n

    return [await ctx.step(f"tx-{n}", write, n, transactional=True) for n in (1, 2, 3)]


@task("sync_tx_steps")
def sync_tx_steps(payload: dict[str, Any], ctx: SyncTaskContext) -> list[Any]:
    """Two plain `def` transactional steps, each inserting 3 rows in `orders` with its
    blocking session; on attempt 1, step 2 raises after writing its rows."""
    orders = ctx.database()["orders"]

    def write(session: ClientSession, n: int) -> dict[str, int]:
        orders.insert_many(
            [{"job_id": ctx.job_id, "step": n, "i": i} for i in range(3)], session=session
        )
        if n == 2 and ctx.attempt == 1:
            raise RuntimeError("step two fails once, inside its transaction")
        return {"n": n, "attempt": ctx.attempt}

    return [ctx.step(f"stx-{n}", write, n, transactional=True) for n in (1, 2)]


@task("sleeper")
async def sleeper(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    before = await ctx.step("before", time.time)
    await ctx.sleep(float(payload.get("seconds", 5)))
    after = await ctx.step("after", time.time)
    return {"before": before, "after": after, "attempt": ctx.attempt}


@task("sync_sleeper")
def sync_sleeper(payload: dict[str, Any], ctx: SyncTaskContext) -> str:
    ctx.sleep(float(payload.get("seconds", 2)))
    return "awake"


@task("waiter")
async def waiter(payload: dict[str, Any], ctx: TaskContext) -> Any:
    try:
        got = await ctx.wait_for_signal(payload["key"], timeout=payload.get("timeout"))
    except SignalTimeout:
        return {"timed_out": True}
    return {"signal": got}


@task("gated_waiter")
def gated_waiter(payload: dict[str, Any], ctx: SyncTaskContext) -> Any:
    """`sync_waiter`, once the file `gate` exists: a test arms a fail point while it is shut."""
    while not os.path.exists(payload["gate"]):
        time.sleep(0.05)
    return {"signal": ctx.wait_for_signal(payload["key"])}


@task("sync_waiter")
def sync_waiter(payload: dict[str, Any], ctx: SyncTaskContext) -> Any:
    return {"signal": ctx.wait_for_signal(payload["key"], timeout=payload.get("timeout"))}


@task("changing")
async def changing(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """A task whose code a test changes under its jobs: a document in `deploys` stands for
    the deploy. The new code fetches with another step (`fetch-v2`), behind
    `ctx.changed("v2")`; each fetch inserts one row in `effects`. Then two signal waits."""
    db = ctx.database()
    deployed = await db["deploys"].find_one({"_id": "changing"}) is not None

    async def fetch(version: str) -> str:
        await db["effects"].insert_one({"job_id": ctx.job_id, "version": version})
        return version

    if deployed and await ctx.changed("v2"):
        got = await ctx.step("fetch-v2", fetch, "new")
    else:
        got = await ctx.step("fetch", fetch, "old")
    await ctx.wait_for_signal(f"{payload['key']}-1")
    await ctx.wait_for_signal(f"{payload['key']}-2")
    return {"fetched": got, "deployed": deployed}


@task("paid_steps")
async def paid_steps(payload: dict[str, Any], ctx: TaskContext) -> list[int]:
    """Five steps, each inserting one row in `effects` and emitting `step N`; step
    `fail_at` raises after its insert (a bug: a rerun fixes it with another payload)."""
    effects = ctx.database()["effects"]

    async def effect(n: int) -> int:
        ctx.emit(f"step {n}\n")
        await effects.insert_one({"job_id": ctx.job_id, "step": n, "attempt": ctx.attempt})
        if n == payload.get("fail_at"):
            raise RuntimeError(f"step {n} has a bug")
        return n

    return [await ctx.step(f"step-{n}", effect, n) for n in range(1, 6)]


@task("sync_changing")
def sync_changing(payload: dict[str, Any], ctx: SyncTaskContext) -> dict[str, Any]:
    """`changing` as a plain `def` task."""
    db = ctx.database()
    deployed = db["deploys"].find_one({"_id": "sync_changing"}) is not None

    def fetch(version: str) -> str:
        db["effects"].insert_one({"job_id": ctx.job_id, "version": version})
        return version

    if deployed and ctx.changed("v2"):
        got = ctx.step("fetch-v2", fetch, "new")
    else:
        got = ctx.step("fetch", fetch, "old")
    ctx.wait_for_signal(f"{payload['key']}-1")
    ctx.wait_for_signal(f"{payload['key']}-2")
    return {"fetched": got, "deployed": deployed}
