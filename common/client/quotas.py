"""The client's quota operations (set, read, list, delete a quota) and the check every
submit makes of the quotas its jobs name: each must exist (a typo must not mean "no
limit"), and no cost may be over its quota's whole units window (it could never start)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from brook.common.domain.errors import ErrorDetail, InvalidInput, QuotaNotFound
from brook.common.domain.models import JobSpec
from brook.common.domain.quota_specs import check_quota_name, validate_quota_update
from brook.common.domain.quotas import Quota
from brook.common.runtime.log_events import Event, log_event, requested_by
from brook.common.store.quotas import QuotaStore

_KEEP: Any = object()  # a limit `set_quota` was not asked to change


def quota_errors(
    specs: Sequence[JobSpec], quotas: Mapping[str, Quota], *, batch: bool
) -> ErrorDetail | None:
    """What is wrong with the quotas `specs` name, given the quotas that exist; None: nothing."""
    errors: list[dict[str, object]] = []
    for i, spec in enumerate(specs):
        for name, cost in (spec.quotas or {}).items():
            where: list[object] = ["jobs", i] if batch else []
            loc = [*where, "quotas", name]
            quota = quotas.get(name)
            if quota is None:
                msg = f"unknown quota {name!r}: set it first (PUT /quotas/{name})"
                errors.append({"loc": loc, "msg": msg, "type": "unknown_quota"})
                continue
            whole = quota.whole_window()
            if whole is not None and cost > whole:
                msg = (
                    f"a cost of {cost} units is over quota {name!r}'s whole window "
                    f"({whole} units): it could never start"
                )
                errors.append({"loc": loc, "msg": msg, "type": "cost_over_window"})
    return errors or None


def quota_names(specs: Sequence[JobSpec]) -> set[str]:
    return {name for spec in specs for name in (spec.quotas or {})}


class QuotaOperations:
    """Set, read, list and delete quotas; mixed into `ClientCore`."""

    _quota_store: QuotaStore

    async def _check_quotas(self, specs: Sequence[JobSpec], *, batch: bool) -> None:
        names = quota_names(specs)
        if not names:
            return
        errors = quota_errors(specs, await self._quota_store.named(names), batch=batch)
        if errors:
            raise InvalidInput(errors)

    async def set_quota(
        self,
        name: str,
        changes: object = None,
        *,
        units: Any = _KEEP,
        requests: Any = _KEEP,
        concurrency: Any = _KEEP,
    ) -> dict[str, Any]:
        """Set a quota's limits, cluster-wide, as a dict (the body of `PUT /quotas/{name}`)
        or as keywords: `units` and `requests` (`{"limit": int, "per_seconds": number}` or
        None), `concurrency` (int or None); what is left out keeps its value. A quota keeps
        at least one. Invalid input raises `InvalidInput` (the API's 422) and stores nothing.
        Returns the quota as `GET /quotas` shows it."""
        body: Any = changes if changes is not None else {}
        given = {"units": units, "requests": requests, "concurrency": concurrency}
        keywords = {k: v for k, v in given.items() if v is not _KEEP}
        if keywords and isinstance(body, Mapping):
            body = {**body, **keywords}
        fields = validate_quota_update(name, body)
        quota = await self._quota_store.set_limits(name, fields)
        if structlog.is_configured():
            log_event(Event.QUOTA_UPDATED, quota=name, by=requested_by.get(), **fields)
        return quota.to_api()

    async def quota(self, name: str) -> dict[str, Any]:
        """One quota as `GET /quotas/{name}` shows it: limits, state (effective rate,
        closed until, debt, what the windows hold) and its ledger; `QuotaNotFound`."""
        check_quota_name(name)
        quota = await self._quota_store.read(name)
        if quota is None:
            raise QuotaNotFound(name)
        return quota.to_api(await self._quota_store.ledger.totals(name))

    async def quota_list(self) -> list[dict[str, Any]]:
        """Every quota's limits and state, without the ledger's counts."""
        return [q.to_api() for q in await self._quota_store.all()]

    async def quotas(self) -> list[dict[str, Any]]:
        """Every quota, as `GET /quotas` lists them: with what its ledger counted `today`."""
        today = await self._quota_store.ledger.today()
        zero = {"units": 0, "requests": 0}
        return [
            {**q.to_api(), "today": today.get(q.name, zero)} for q in await self._quota_store.all()
        ]

    async def quota_units(self) -> dict[str, float]:
        """Units counted per quota over its ledger's days (the metrics' counter)."""
        return await self._quota_store.ledger.units_by_quota()

    async def delete_quota(self, name: str) -> None:
        """Remove a quota; `QuotaNotFound` if there is none. Jobs that name it wait."""
        check_quota_name(name)
        if not await self._quota_store.delete(name):
            raise QuotaNotFound(name)
        if structlog.is_configured():
            log_event(Event.QUOTA_DELETED, quota=name, by=requested_by.get())
