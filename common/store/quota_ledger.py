"""`QuotaLedger`: the only code that touches `brook_quota_ledger`, the quotas' cost ledger.

Units and requests per quota, and per quota and key (tenant), per minute and per day, one
document each (`{quota, key, period, at, units, requests, rate_limited?}`; the quota as a
whole under the key `""`); the minutes are kept two days, the days a year (TTL). Each start
books its estimate and one request; each usage report books its difference.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import ASCENDING, IndexModel, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.models import Doc

LEDGER = "brook_quota_ledger"
MINUTES_KEPT = timedelta(days=2)
DAYS_KEPT = timedelta(days=366)
NO_KEY = ""  # the ledger's key for the quota as a whole


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def _day(at: datetime) -> datetime:
    return at.replace(hour=0, minute=0, second=0, microsecond=0)


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


class QuotaLedger:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.ledger: AsyncCollection[Doc] = db[LEDGER]
        self._indexed: asyncio.Future[list[str]] | None = None

    async def ensure_indexes(self) -> None:
        if self._indexed is None or (self._indexed.done() and self._indexed.exception()):
            self._indexed = asyncio.ensure_future(
                self.ledger.create_indexes(
                    [
                        IndexModel(
                            [("quota", ASCENDING), ("period", ASCENDING), ("at", ASCENDING)],
                            name="ledger_by_quota",
                        ),
                        IndexModel(
                            [("expire_at", ASCENDING)], name="ledger_ttl", expireAfterSeconds=0
                        ),
                    ]
                )
            )
        await asyncio.shield(self._indexed)

    async def book(
        self, name: str, key: str | None, at: datetime | None, units: float, requests: int
    ) -> None:
        await self.ensure_indexes()
        when = _aware(at) if at is not None else datetime.now(UTC)
        ops = []
        for k in {NO_KEY, key or NO_KEY}:
            for period, start, kept in (
                ("minute", _minute(when), MINUTES_KEPT),
                ("day", _day(when), DAYS_KEPT),
            ):
                ops.append(
                    UpdateOne(
                        {"quota": name, "key": k, "period": period, "at": start},
                        {
                            "$inc": {"units": units, "requests": requests},
                            "$setOnInsert": {"expire_at": start + kept},
                        },
                        upsert=True,
                    )
                )
        await self.ledger.bulk_write(ops, ordered=False)

    async def book_429(self, name: str) -> None:
        await self.ensure_indexes()
        when = datetime.now(UTC)
        await self.ledger.update_one(
            {"quota": name, "key": NO_KEY, "period": "day", "at": _day(when)},
            {"$inc": {"rate_limited": 1}, "$setOnInsert": {"expire_at": _day(when) + DAYS_KEPT}},
            upsert=True,
        )

    async def totals(self, name: str, minutes: int = 60, days: int = 30) -> dict[str, Any]:
        """The quota's ledger: the last `minutes` minutes and `days` days, as a whole and by
        key (tenant), and every unit ever counted here."""
        now = datetime.now(UTC)
        since = {
            "minute": _minute(now) - timedelta(minutes=minutes),
            "day": _day(now) - timedelta(days=days),
        }
        rows = await self.ledger.find(
            {
                "quota": name,
                "$or": [{"period": p, "at": {"$gte": s}} for p, s in since.items()],
            },
            sort=[("at", ASCENDING)],
        ).to_list()
        out: dict[str, Any] = {"minutes": [], "days": [], "keys": {}}
        for r in rows:
            entry = {
                "at": r["at"],
                "units": r.get("units", 0),
                "requests": r.get("requests", 0),
                **({"rate_limited": r["rate_limited"]} if "rate_limited" in r else {}),
            }
            if r.get("key", NO_KEY) == NO_KEY:
                out["minutes" if r["period"] == "minute" else "days"].append(entry)
            else:
                by_key = out["keys"].setdefault(r["key"], {"minutes": [], "days": []})
                by_key["minutes" if r["period"] == "minute" else "days"].append(entry)
        return out

    async def units_by_quota(self) -> dict[str, float]:
        """Units counted per quota over the ledger's days (the metrics' counter)."""
        rows = await (
            await self.ledger.aggregate(
                [
                    {"$match": {"period": "day", "key": NO_KEY}},
                    {"$group": {"_id": "$quota", "units": {"$sum": "$units"}}},
                ]
            )
        ).to_list()
        return {str(r["_id"]): float(r["units"] or 0) for r in rows}

    async def today(self) -> dict[str, dict[str, float]]:
        """Each quota's units and requests counted today (UTC), by name."""
        day = _day(datetime.now(UTC))
        rows = await self.ledger.find({"period": "day", "key": NO_KEY, "at": day}).to_list()
        return {
            str(r["quota"]): {"units": r.get("units", 0), "requests": r.get("requests", 0)}
            for r in rows
        }
