"""The jobs' side of quotas: a claimed job a quota has no room for, handed back to wait for
it, and the waiters woken when a quota's hold is released; and a usage report's update of
a quota's document (`usage_reported`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from brook.common.domain.quotas import BUCKETS, Holder
from brook.common.store.fields import NOW, P, history, lit
from brook.common.store.queries.base import Write, running_fence
from brook.common.store.records import Lease


def held_by_quota(lease: Lease, owner: str, name: str, reason: str, until: datetime) -> Write:
    """running (claimed, never started) → pending, due `until`: quota `name` has no room for
    it (`reason`). Not an attempt: its number is given back, as a release's is, and the job
    says what it waits for (`waiting_for: {"kind": "quota", "name"}`). A cancel asked
    meanwhile is left to the next claim, which sees it first."""
    return Write(
        filter=running_fence(lease, owner),
        update=[
            {
                "$set": {
                    "status": P,
                    "attempts": {"$add": ["$attempts", -1]},
                    "run_at": lit(until),
                    "waiting_for": {
                        "kind": "quota",
                        "name": lit(name),
                        "reason": lit(reason),
                        "since": NOW,
                    },
                    "updated_at": NOW,
                    "owner": None,
                    "lease_expires_at": None,
                    **_held_history(lease.attempt, name),
                }
            }
        ],
    )


def _held_history(attempt: int, name: str) -> dict[str, Any]:
    """The history with this hold: the claim's `running` entry and the hold's `pending`
    one. But a claim and a hold that repeat the two entries before them (the same quota,
    the same attempt) are counted on that hold (`holds`, and the latest at `last_at`), the
    claim's entry dropped: a job held back fifty times tells it in two entries, not a
    hundred (which pushed the rest of its story out of the capped history)."""
    added = history(
        {"status": P, "at": NOW, "attempt": attempt, "reason": "quota", "quota": lit(name)}
    )
    h = {"$ifNull": ["$history", []]}
    repeat = {
        "$and": [
            {"$gt": [{"$size": h}, 2]},
            {"$eq": ["$$last.status", "running"]},
            {"$eq": ["$$last.attempt", attempt]},
            {"$eq": ["$$prev.status", P]},
            {"$eq": ["$$prev.reason", "quota"]},
            {"$eq": ["$$prev.quota", lit(name)]},
            {"$eq": ["$$prev.attempt", attempt]},
        ]
    }
    counted = {
        "$mergeObjects": [
            "$$prev",
            {"holds": {"$add": [{"$ifNull": ["$$prev.holds", 1]}, 1]}, "last_at": NOW},
        ]
    }
    merged = {"$concatArrays": [{"$slice": [h, {"$subtract": [{"$size": h}, 2]}]}, [counted]]}
    ends = {"prev": {"$arrayElemAt": [h, -2]}, "last": {"$arrayElemAt": [h, -1]}}
    kept = {"$ifNull": ["$history_truncated", 0]}
    return {
        "history": {"$let": {"vars": ends, "in": {"$cond": [repeat, merged, added["history"]]}}},
        "history_truncated": {
            "$let": {
                "vars": ends,
                "in": {"$cond": [repeat, kept, added["history_truncated"]]},
            }
        },
    }


def quota_waiters(name: str) -> dict[str, Any]:
    """The pending jobs held back by quota `name` and not due yet."""
    return {
        "status": P,
        "waiting_for.kind": "quota",
        "waiting_for.name": name,
        "$expr": {"$gt": ["$run_at", NOW]},
    }


def woken_for_quota(name: str, ids: list[str]) -> Write:
    """pending (held back by quota `name`) → pending, due now: the quota has room again."""
    return Write(
        filter={"_id": {"$in": ids}, "status": P, "waiting_for.name": name},
        update=[{"$set": {"run_at": NOW, "updated_at": NOW}}],
    )


def usage_reported(
    name: str, holder: Holder, total: float, ago_ms: int, learned_est: float, learned_used: float
) -> Write:
    """An attempt's real usage so far (`ctx.usage`), on the quota's document in one atomic
    update, fenced by what the attempt's hold was charged (a report racing another reads
    again): its charge leaves the bucket it was charged to (`holder.t`) and `total` is
    charged to the bucket of the report (`ago_ms` before now on the server's clock: the
    task said it then; never earlier than `holder.t`), for its key too, created if
    missing; the hold says `total`, reported, and that bucket; the usage ratio's sums grow.
    The provider counted the call from its arrival, somewhere between the start's charge
    and this report: counted from the charge until a window after the report, it is freed
    no sooner than the provider frees it, however long the job waited for a worker or its
    call for an answer."""
    fresh = {
        "$floor": {
            "$divide": [
                {"$subtract": [{"$toLong": NOW}, ago_ms]},
                {"$multiply": ["$units.per_seconds", 1000 / BUCKETS]},
            ]
        }
    }
    new_t: Any = fresh if holder.t is None else {"$max": [holder.t, fresh]}
    return Write(
        filter={
            "_id": name,
            "holders": {
                "$elemMatch": {"job": holder.job, "attempt": holder.attempt, "units": holder.units}
            },
        },
        update=[
            {"$set": {"_t": new_t, "_bs": {"$ifNull": ["$buckets.units", []]}}},
            {
                "$set": {
                    "buckets.units": _buckets_moved(holder, total),
                    "holders": _hold_reported(holder, total),
                    "version": {"$add": ["$version", 1]},
                    "learned.est": {"$add": [{"$ifNull": ["$learned.est", 0]}, learned_est]},
                    "learned.used": {"$add": [{"$ifNull": ["$learned.used", 0]}, learned_used]},
                }
            },
            {"$unset": ["_t", "_bs"]},
        ],
    )


def _buckets_moved(holder: Holder, total: float) -> dict[str, Any]:
    """The units buckets (`$_bs`) with the hold's charge moved to bucket `$_t` as `total`,
    that bucket added if missing (none without a units window, when `$_t` is null)."""
    key = holder.key
    bucket = {
        "$mergeObjects": [
            "$$b",
            {
                "n": {"$add": ["$$b.n", _moved("$$b.t", holder.t, holder.units, total)]},
                "keys": _keys_moved("$$b", holder.t, key, holder.units, total),
            },
        ]
    }
    added = {"t": "$_t", "n": total, "keys": [] if key is None else [{"k": lit(key), "n": total}]}
    there = {"$or": [{"$eq": ["$_t", None]}, {"$in": ["$_t", "$_bs.t"]}]}
    return {
        "$concatArrays": [
            {"$map": {"input": "$_bs", "as": "b", "in": bucket}},
            {"$cond": [there, [], [added]]},
        ]
    }


def _hold_reported(holder: Holder, total: float) -> dict[str, Any]:
    """The holds with this attempt's saying `total`, reported, in bucket `$_t`."""
    mine = {
        "$and": [{"$eq": ["$$h.job", lit(holder.job)]}, {"$eq": ["$$h.attempt", holder.attempt]}]
    }
    reported = {"$mergeObjects": ["$$h", {"units": total, "reported": True, "t": "$_t"}]}
    return {
        "$map": {
            "input": "$holders",
            "as": "h",
            "in": {"$cond": [mine, reported, "$$h"]},
        }
    }


def _moved(t: str, old_t: int | None, charged: float, total: float) -> dict[str, Any]:
    """What bucket `t` gains: `total` if it is the new one, less `charged` if the old one."""
    return {
        "$subtract": [
            {"$cond": [{"$eq": [t, "$_t"]}, total, 0]},
            {"$cond": [{"$eq": [t, old_t]}, charged, 0]},
        ]
    }


def _keys_moved(b: str, old_t: int | None, key: str | None, charged: float, total: float) -> Any:
    """A bucket's per-key counts with the report's key moved as its `n` is."""
    keys = {"$ifNull": [f"{b}.keys", []]}
    if key is None:
        return keys
    gain = _moved(f"{b}.t", old_t, charged, total)
    names = {"$map": {"input": keys, "as": "k", "in": "$$k.k"}}
    return {
        "$concatArrays": [
            {
                "$map": {
                    "input": keys,
                    "as": "k",
                    "in": {
                        "$cond": [
                            {"$eq": ["$$k.k", lit(key)]},
                            {"$mergeObjects": ["$$k", {"n": {"$add": ["$$k.n", gain]}}]},
                            "$$k",
                        ]
                    },
                }
            },
            {
                "$cond": [
                    {
                        "$and": [
                            {"$eq": [f"{b}.t", "$_t"]},
                            {"$not": [{"$in": [lit(key), names]}]},
                        ]
                    },
                    [{"k": lit(key), "n": gain}],
                    [],
                ]
            },
        ]
    }
