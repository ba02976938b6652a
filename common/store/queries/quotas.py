"""The jobs' side of quotas: a claimed job a quota has no room for, handed back to wait for
it, and the waiters woken when a quota's hold is released."""

from __future__ import annotations

from datetime import datetime
from typing import Any

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
                    **history(
                        {
                            "status": P,
                            "at": NOW,
                            "attempt": lease.attempt,
                            "reason": "quota",
                            "quota": lit(name),
                        }
                    ),
                }
            }
        ],
    )


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
