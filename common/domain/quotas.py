"""Quotas: named limits shared by every queue and task that draws on them (a provider's
tokens and requests per minute, its calls at once), without a database.

A quota holds any of `units` (weighted starts in a window: a job's cost), `requests` (one
per start, in a window) and `concurrency` (jobs running at once). Its state lives in
`brook_quotas` (`brook.common.store.quotas`); this module is its arithmetic: whether a start
may be charged (`admit`), what a usage report or a 429 changes, and how a quota reads.

Windows are counted in buckets, `BUCKETS` to a window: a start is charged to the bucket of
its moment, and admission sums every bucket that overlaps the last `per_seconds` (one more
than a window's worth), so no window of `per_seconds`, wherever it starts, holds more than
the limit, save a debt (below). The price: up to 1/BUCKETS of the limit left unused.

Bursts: within one bucket at most BURST buckets' share of the limit is admitted (its starts
that have not reported counted at estimate x the usage ratio, as admission counts them), so
that the usage the first starts report corrects the window before estimates alone fill it;
and while 429s hold the effective rate below the limit (also while it steps back up), only
one bucket's share (the even pace), so that a quota that reopens does not refill the
provider's window at once, and each step up probes the provider's limit with a bucket's
share, not a burst.

The usage ratio (reported usage over the estimates of the attempts that reported, as if
`RATIO_PRIOR` of a window had reported its estimate, within `RATIO_MIN`-`RATIO_MAX`, the
sums halved once their estimates pass a window's limit): a start is admitted on its cost
x the ratio, and a start in flight that has not reported counts at its estimate x the
ratio, so the first reports correct every start still on estimates. Before the first
report, for a window from the first start, those hold at most `COLD_SHARE` of the limit.

Debt: a usage report (`ctx.usage`) that lands after a start can charge more than the
estimate and overdraw the window; the window then holds more than the limit and admits
nothing until enough of it has aged out.

The adaptive rule (AIMD): each 429 (`RateLimited`) multiplies the quota's effective rate by
`DECREASE` (never below `FLOOR` of the limit) when it comes within a window of the previous
one, unless what it says of the provider's window (below) lowers the rate by more than a
bucket's share already, which is then taken alone. A lone 429 only closes the quota; the
429s of calls in flight while it is closed count as that one; a 429 while the units window
holds its whole limit by Brook's count, less a bucket's share, is no strike: the estimates
were short, not the limit; but if 429s had lowered the rate by more than a bucket's share,
such a 429 shaves it by `SHAVE`. Each window without a 429 adds `INCREASE` of the limit
back, up to the whole limit. A 429 also caps the effective rate at what it says of the
provider's window (`_room_said`): what Brook's window will still hold when the provider
has room again, the bucket that straddles that window's start counted in part
(`Quota.used_through`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

BUCKETS = 20  # buckets to a window
# At most this many buckets' share of a window is admitted within one bucket (a burst): the
# estimates of the starts in flight are corrected by their usage before the window fills.
BURST = 4
RATIO_MIN = 1.0  # the usage ratio's bounds
RATIO_MAX = 4.0
RATIO_PRIOR = 0.02  # the ratio starts at 1 as if this share of a window had reported so
# For a window from a quota's first start, until its first report, the starts in flight on
# estimates alone hold at most this share of its units limit: real usage up to twice the
# estimates stays within it.
COLD_SHARE = 0.5
DECREASE = 0.7  # each 429 within a window of the previous one: the effective rate x 0.7
FLOOR = 0.1  # never below this share of the limit
INCREASE = 0.1  # each window without a 429: this share of the limit back
SHAVE = 0.95  # a 429 at a lowered effective limit that Brook's window holds: x 0.95
# A fair share is kept among the keys (tenants) refused room within this many windows.
FAIR_WINDOWS = 1.0
# A job waiting on a quota's concurrency is looked at again after this long at most (a
# released slot wakes one at once; this covers a holder whose dispatcher died).
CONCURRENCY_RECHECK_S = 5.0

WindowName = Literal["units", "requests"]
WINDOWS: tuple[WindowName, ...] = ("units", "requests")


# -- a quota's state ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Window:
    limit: int
    per_seconds: float

    @property
    def bucket_s(self) -> float:
        return self.per_seconds / BUCKETS

    def bucket(self, now: datetime) -> int:
        return math.floor(now.timestamp() / self.bucket_s)

    def counted(self, t: int, now: datetime) -> bool:
        """Whether bucket `t` overlaps the window that ends `now`."""
        return t >= self.bucket(now) - BUCKETS

    def leaves_at(self, t: int) -> float:
        """When bucket `t` stops counting (a timestamp)."""
        return (t + BUCKETS + 1) * self.bucket_s


@dataclass(frozen=True, kw_only=True)
class Bucket:
    t: int
    n: float
    keys: tuple[tuple[str, float], ...] = ()

    def to_doc(self) -> dict[str, Any]:
        return {"t": self.t, "n": self.n, "keys": [{"k": k, "n": n} for k, n in self.keys]}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Bucket:
        keys = tuple((str(k["k"]), float(k["n"])) for k in doc.get("keys") or ())
        return cls(t=int(doc["t"]), n=float(doc["n"]), keys=keys)

    def plus(self, n: float, key: str | None) -> Bucket:
        keys = dict(self.keys)
        if key is not None:
            keys[key] = keys.get(key, 0.0) + n
        return replace(self, n=self.n + n, keys=tuple(keys.items()))


@dataclass(frozen=True, kw_only=True)
class Holder:
    """A started attempt holding the quota (its concurrency, and what it was charged)."""

    job: str
    attempt: int
    owner: str
    key: str | None
    units: float  # charged so far (the estimate, then what `ctx.usage` reported)
    t: int | None  # the units bucket it was charged to
    reported: bool = False
    estimate: float | None = None  # its cost at the start (None: stored before it was kept)

    def to_doc(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "attempt": self.attempt,
            "owner": self.owner,
            "key": self.key,
            "units": self.units,
            "t": self.t,
            "reported": self.reported,
            "estimate": self.estimate,
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Holder:
        t = doc.get("t")
        return cls(
            job=str(doc["job"]),
            attempt=int(doc["attempt"]),
            owner=str(doc.get("owner", "")),
            key=doc.get("key"),
            units=float(doc.get("units", 0)),
            t=int(t) if t is not None else None,
            reported=bool(doc.get("reported", False)),
            estimate=float(doc["estimate"]) if doc.get("estimate") is not None else None,
        )


@dataclass(frozen=True, kw_only=True)
class Quota:
    """One quota as stored: its limits and its state (`version` orders every write)."""

    name: str
    units: Window | None = None
    requests: Window | None = None
    concurrency: int | None = None
    version: int = 0
    buckets: Mapping[WindowName, tuple[Bucket, ...]] = field(default_factory=dict)
    holders: tuple[Holder, ...] = ()
    closed_until: datetime | None = None
    factor: float = 1.0  # the effective rate, as a share of the limits
    strikes: int = 0  # 429s in a row, each within a window of the previous one
    last_429: datetime | None = None
    calm_since: datetime | None = None  # since when no 429 (recovery steps count from it)
    waiting: tuple[tuple[str, datetime], ...] = ()  # keys refused room, and when
    # The usage ratio's sums: the estimates of the attempts that reported, and their reports.
    learned_est: float = 0.0
    learned_used: float = 0.0
    cold_until: datetime | None = None  # a window after its first start (see `COLD_SHARE`)
    now: datetime | None = None  # the server's clock when read

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Quota:
        buckets: dict[WindowName, tuple[Bucket, ...]] = {
            w: tuple(Bucket.from_doc(b) for b in (doc.get("buckets") or {}).get(w) or ())
            for w in WINDOWS
        }
        return cls(
            name=str(doc["_id"]),
            units=_window(doc.get("units")),
            requests=_window(doc.get("requests")),
            concurrency=doc.get("concurrency"),
            version=int(doc.get("version", 0)),
            buckets=buckets,
            holders=tuple(Holder.from_doc(h) for h in doc.get("holders") or ()),
            closed_until=doc.get("closed_until"),
            factor=float(doc.get("factor", 1.0)),
            strikes=int(doc.get("strikes", 0)),
            last_429=doc.get("last_429"),
            calm_since=doc.get("calm_since"),
            waiting=tuple((str(w["k"]), w["at"]) for w in doc.get("waiting") or ()),
            learned_est=float((doc.get("learned") or {}).get("est", 0.0)),
            learned_used=float((doc.get("learned") or {}).get("used", 0.0)),
            cold_until=doc.get("cold_until"),
            now=doc.get("now"),
        )

    def state_doc(self) -> dict[str, Any]:
        """The fields a write of this state sets (not the limits)."""
        return {
            "buckets": {w: [b.to_doc() for b in self.buckets.get(w, ())] for w in WINDOWS},
            "holders": [h.to_doc() for h in self.holders],
            "closed_until": self.closed_until,
            "factor": self.factor,
            "strikes": self.strikes,
            "last_429": self.last_429,
            "calm_since": self.calm_since,
            "waiting": [{"k": k, "at": at} for k, at in self.waiting],
            "learned": {"est": self.learned_est, "used": self.learned_used},
            "cold_until": self.cold_until,
        }

    def window(self, name: WindowName) -> Window | None:
        return self.units if name == "units" else self.requests

    def longest_s(self) -> float:
        spans = [w.per_seconds for w in (self.units, self.requests) if w is not None]
        return max(spans, default=60.0)

    def whole_window(self) -> int | None:
        """The most units one job may cost: the units window's limit (None: no units)."""
        return None if self.units is None else self.units.limit

    def used(self, name: WindowName, now: datetime) -> float:
        w = self.window(name)
        if w is None:
            return 0.0
        return sum(b.n for b in self.buckets.get(name, ()) if w.counted(b.t, now))

    def used_through(self, name: WindowName, at: datetime) -> float:
        """What the window will hold at `at` of what it holds now, as a sliding window of
        `per_seconds` counts it: the bucket that straddles its start counted for the part of
        it still inside (charges spread evenly over a bucket). Admission counts that bucket
        whole (`used`), to be safe; what a provider's 429 says is read against this."""
        w = self.window(name)
        if w is None:
            return 0.0
        start = at.timestamp() - w.per_seconds
        total = 0.0
        for b in self.buckets.get(name, ()):
            inside = ((b.t + 1) * w.bucket_s - start) / w.bucket_s
            total += b.n * min(max(inside, 0.0), 1.0)
        return total

    def used_by(self, name: WindowName, key: str, now: datetime) -> float:
        w = self.window(name)
        if w is None:
            return 0.0
        return sum(
            n
            for b in self.buckets.get(name, ())
            if w.counted(b.t, now)
            for k, n in b.keys
            if k == key
        )

    def effective(self, name: WindowName) -> float | None:
        w = self.window(name)
        return None if w is None else max(w.limit * self.factor, 1.0)

    def usage_ratio(self) -> float:
        """Reported usage over the estimates of the attempts that reported (the module's
        docstring says how it is learned), between `RATIO_MIN` and `RATIO_MAX`."""
        if self.units is None:
            return 1.0
        prior = RATIO_PRIOR * self.units.limit
        ratio = (self.learned_used + prior) / (self.learned_est + prior)
        return min(max(ratio, RATIO_MIN), RATIO_MAX)

    def in_flight_extra(self, now: datetime) -> float:
        """What the attempts that have not reported yet add to the units window's buckets
        at `now`: each counts at its estimate x the usage ratio until it reports (its call
        may come late, and its report moves its charge to the report's moment), in place of
        its estimate in the bucket it was charged to, if that one still counts."""
        w = self.units
        if w is None:
            return 0.0
        ratio = self.usage_ratio()
        return sum(
            h.units * ratio - (h.units if h.t is not None and w.counted(h.t, now) else 0.0)
            for h in self.holders
            if not h.reported
        )

    def debt(self, now: datetime) -> float:
        """What the units window holds over its limit (usage reported after the starts)."""
        if self.units is None:
            return 0.0
        return max(self.used("units", now) - self.units.limit, 0.0)

    def to_api(self, totals: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """As the API shows it, its effective rate as it stands now."""
        q = recovered(self, self.now) if self.now is not None else self
        return q._api(totals)

    def _api(self, totals: Mapping[str, Any] | None) -> dict[str, Any]:
        now = self.now
        out: dict[str, Any] = {
            "name": self.name,
            "units": _window_api(self.units),
            "requests": _window_api(self.requests),
            "concurrency": self.concurrency,
            "running": len(self.holders),
            "closed_until": self.closed_until
            if self.closed_until is not None and (now is None or self.closed_until > now)
            else None,
            "effective_rate": round(self.factor, 4),
            "strikes": self.strikes,
            "usage_ratio": round(self.usage_ratio(), 4),
        }
        if now is not None:
            out["used"] = {w: self.used(w, now) for w in WINDOWS if self.window(w) is not None}
            out["debt"] = self.debt(now)
        if totals is not None:
            out["totals"] = dict(totals)
        return out


def _window(doc: Mapping[str, Any] | None) -> Window | None:
    if not doc:
        return None
    return Window(limit=int(doc["limit"]), per_seconds=float(doc["per_seconds"]))


def _window_api(w: Window | None) -> dict[str, Any] | None:
    return None if w is None else {"limit": w.limit, "per_seconds": w.per_seconds}


# -- admission ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Start:
    """A start to admit: one attempt of one job, its key and its cost in this quota."""

    job: str
    attempt: int
    owner: str
    key: str | None
    cost: int


@dataclass(frozen=True, kw_only=True)
class Refused:
    """No room: why (`closed`, `concurrency`, `units`, `requests`, `fair`), and when to look
    again (a timestamp on the server's clock), each refused job at a moment of its own
    within `spread` seconds after it: a window's room comes back over a bucket, as the
    provider's charges age out one by one, and starts let in at one instant would all meet
    a limit the provider has just lowered."""

    reason: str
    retry_at: float
    spread: float = 0.0


def recovered(q: Quota, now: datetime) -> Quota:
    """The quota with its effective rate stepped back up for each calm window since the last
    429 or step (additive increase), and its strikes forgotten after a calm window."""
    if q.factor >= 1.0 or q.calm_since is None:
        return q
    span = timedelta(seconds=q.longest_s())
    steps = int((now - q.calm_since) / span)
    if steps <= 0:
        return q
    factor = min(1.0, q.factor + INCREASE * steps)
    return replace(q, factor=factor, strikes=0, calm_since=q.calm_since + steps * span)


def admit(q: Quota, start: Start, now: datetime) -> Quota | Refused:
    """The quota with `start` charged and holding it, or why not and until when."""
    q = recovered(q, now)
    if q.closed_until is not None and q.closed_until > now:
        return Refused(reason="closed", retry_at=q.closed_until.timestamp(), spread=_bucket_s(q))
    if any(h.job == start.job and h.attempt == start.attempt for h in q.holders):
        return q  # charged already (a retried write whose answer was lost)
    ts = now.timestamp()
    if q.concurrency is not None and len(q.holders) >= q.concurrency:
        return Refused(reason="concurrency", retry_at=ts + CONCURRENCY_RECHECK_S)
    costs: dict[WindowName, float] = {"units": float(start.cost), "requests": 1.0}
    # Units are admitted on the cost x the usage ratio, beside what the starts in flight
    # will report over their estimates.
    expected: dict[WindowName, float] = {"units": costs["units"] * q.usage_ratio(), "requests": 1.0}
    for name in WINDOWS:
        w, limit = q.window(name), q.effective(name)
        if w is None or limit is None:
            continue
        used = q.used(name, now)
        extra = q.in_flight_extra(now) if name == "units" else 0.0
        # A cost over the effective limit (lowered by 429s) starts alone in an empty window.
        if used + extra + expected[name] > limit and used + extra > 0:
            room_at = _room_at(q, name, expected[name], limit - extra, now)
            return Refused(reason=name, retry_at=room_at, spread=w.bucket_s)
        if name == "units" and _cold(q, expected[name], limit, now):
            return Refused(
                reason=name, retry_at=(w.bucket(now) + BURST) * w.bucket_s, spread=w.bucket_s
            )
        burst = _in_bucket(q, name, now)
        if burst > 0 and burst + expected[name] > limit * _burst(q, now) / BUCKETS:
            return Refused(
                reason=name, retry_at=(w.bucket(now) + 1) * w.bucket_s, spread=w.bucket_s
            )
    unfair = _over_share(q, start, now)
    if unfair is not None:
        return unfair
    return _charged(q, start, costs, now)


def _charged(q: Quota, start: Start, costs: Mapping[WindowName, float], now: datetime) -> Quota:
    buckets = dict(q.buckets)
    t_units: int | None = None
    for name in WINDOWS:
        w = q.window(name)
        if w is None:
            continue
        t = w.bucket(now)
        if name == "units":
            t_units = t
        kept = [b for b in buckets.get(name, ()) if w.counted(b.t, now)]
        current = next((b for b in kept if b.t == t), Bucket(t=t, n=0.0))
        kept = [b for b in kept if b.t != t] + [current.plus(costs[name], start.key)]
        buckets[name] = tuple(kept)
    holder = Holder(
        job=start.job,
        attempt=start.attempt,
        owner=start.owner,
        key=start.key,
        units=float(start.cost),
        t=t_units,
        estimate=float(start.cost),
    )
    # A key stays among the waiting until a window passes without a refusal of it: one
    # start does not end its claim to a share.
    waiting = tuple((k, at) for k, at in q.waiting if _recent(q, at, now))
    q = replace(q, buckets=buckets, holders=(*q.holders, holder), waiting=waiting)
    if q.units is not None and q.cold_until is None:
        q = replace(q, cold_until=now + timedelta(seconds=q.units.per_seconds))
    if q.units is not None and q.learned_est > q.units.limit:
        q = replace(q, learned_est=q.learned_est / 2, learned_used=q.learned_used / 2)
    return q


def learned(holder: Holder, total: float) -> tuple[float, float]:
    """What a report of `total` adds to the usage ratio's sums (estimates, usage): an
    attempt's first report adds its estimate and its total, a later one what it added."""
    if holder.reported:
        return 0.0, total - holder.units
    estimate = holder.estimate if holder.estimate is not None else holder.units
    return estimate, total


def _recent(q: Quota, at: datetime, now: datetime) -> bool:
    return at > now - timedelta(seconds=q.longest_s() * FAIR_WINDOWS)


def waiting_key(q: Quota, key: str | None, now: datetime) -> Quota:
    """The quota with `key` recorded as refused room now (fair shares count it)."""
    if key is None:
        return q
    kept = tuple((k, at) for k, at in q.waiting if k != key and _recent(q, at, now))
    return replace(q, waiting=(*kept, (key, now)))


def _over_share(q: Quota, start: Start, now: datetime) -> Refused | None:
    """With other keys refused room lately, a key that already took more than its share of
    a window (or of the concurrency) waits, so that they get theirs."""
    if start.key is None:
        return None
    others = {k for k, at in q.waiting if k != start.key and _recent(q, at, now)}
    if not others:
        return None
    share = 1.0 / (len(others) + 1)
    if q.concurrency is not None:
        mine = sum(1 for h in q.holders if h.key == start.key)
        if mine + 1 > max(q.concurrency * share, 1.0):
            return Refused(reason="fair", retry_at=now.timestamp() + CONCURRENCY_RECHECK_S)
    for name in WINDOWS:
        w, limit = q.window(name), q.effective(name)
        if w is None or limit is None:
            continue
        cost = float(start.cost) if name == "units" else 1.0
        if q.used_by(name, start.key, now) + cost > limit * share:
            return Refused(
                reason="fair", retry_at=_key_room_at(q, name, start.key, limit * share - cost, now)
            )
    return None


def _key_room_at(q: Quota, name: WindowName, key: str, most: float, now: datetime) -> float:
    """When `key`'s part of the window will have aged down to `most`: a timestamp."""
    w = q.window(name)
    assert w is not None
    mine = sorted(
        (
            (b.t, sum(n for k, n in b.keys if k == key))
            for b in q.buckets.get(name, ())
            if w.counted(b.t, now)
        ),
    )
    used = sum(n for _, n in mine)
    for t, n in mine:
        used -= n
        if used <= max(most, 0.0):
            return w.leaves_at(t)
    return now.timestamp() + w.bucket_s


def _cold(q: Quota, cost: float, limit: float, now: datetime) -> bool:
    """Whether a start of `cost` would take the starts in flight past `COLD_SHARE` of the
    limit within a window of the quota's first start, before it has learned anything from
    a report (so how far off estimates are is unknown); a start alone always may."""
    if q.learned_est > 0 or (q.cold_until is not None and _aware(q.cold_until) <= now):
        return False
    flying = sum(h.units for h in q.holders if not h.reported)
    return flying > 0 and flying + cost > limit * COLD_SHARE


def _bucket_s(q: Quota) -> float:
    """The shortest bucket of the quota's windows (0 without one)."""
    return min((w.bucket_s for w in (q.units, q.requests) if w is not None), default=0.0)


def _burst(q: Quota, now: datetime) -> int:
    """How many buckets' share of the limit one bucket may admit: `BURST`, but one (the
    pace that spends a window evenly) while 429s hold the effective rate below the limit,
    also while it steps back up. The provider's limit is in doubt: its room grows as its
    window ages, not all at once when the quota reopens, and a step up is a probe of it,
    spread over the window rather than spent in one bucket."""
    return 1 if q.factor < 1.0 else BURST


def _in_bucket(q: Quota, name: WindowName, now: datetime) -> float:
    """What the window's current bucket holds: for units, its starts that have not reported
    at their estimate x the usage ratio, as admission counts them."""
    w = q.window(name)
    assert w is not None
    t = w.bucket(now)
    held = sum(b.n for b in q.buckets.get(name, ()) if b.t == t)
    if name != "units":
        return held
    extra = q.usage_ratio() - 1.0
    return held + sum(h.units * extra for h in q.holders if not h.reported and h.t == t)


def _room_at(q: Quota, name: WindowName, cost: float, limit: float, now: datetime) -> float:
    """When enough of the window will have aged out for `cost`: a timestamp."""
    w = q.window(name)
    assert w is not None
    counted = sorted((b for b in q.buckets.get(name, ()) if w.counted(b.t, now)), key=lambda b: b.t)
    used = sum(b.n for b in counted)
    for b in counted:
        used -= b.n
        if used + cost <= limit or used <= 0:
            return w.leaves_at(b.t)
    return now.timestamp() + w.bucket_s


def released(q: Quota, job: str, attempt: int) -> Quota:
    """The quota without that attempt's hold (its units stay charged)."""
    return replace(
        q, holders=tuple(h for h in q.holders if not (h.job == job and h.attempt == attempt))
    )


def reported(
    q: Quota, job: str, attempt: int, total: float, now: datetime
) -> tuple[Quota, float] | None:
    """The quota with an attempt's units corrected to `total` (its real usage so far): the
    difference from what it was charged, charged or refunded in the bucket it was charged to
    (a refund to a bucket that no longer counts changes nothing), and that difference. None
    if the attempt holds no charge here."""
    holder = next((h for h in q.holders if h.job == job and h.attempt == attempt), None)
    if holder is None:
        return None
    delta = total - holder.units
    buckets = dict(q.buckets)
    w = q.units
    if w is not None and delta != 0:
        t = holder.t if holder.t is not None else w.bucket(now)
        kept = [b for b in buckets.get("units", ()) if w.counted(b.t, now)]
        if not w.counted(t, now):
            t = w.bucket(now) if delta > 0 else t
        current = next((b for b in kept if b.t == t), None)
        if current is None and delta > 0:
            current = Bucket(t=t, n=0.0)
        if current is not None:
            kept = [b for b in kept if b.t != t] + [current.plus(delta, holder.key)]
        buckets["units"] = tuple(kept)
    holders = tuple(replace(h, units=total, reported=True) if h is holder else h for h in q.holders)
    return replace(q, buckets=buckets, holders=holders), delta


def refunded(q: Quota, job: str, attempt: int, now: datetime) -> Quota:
    """The quota without an attempt that never started: its units refunded, its hold gone."""
    out = reported(q, job, attempt, 0.0, now)
    return released(out[0] if out is not None else q, job, attempt)


def rate_limited(
    q: Quota, delay_s: float, now: datetime, attempt: tuple[str, int] | None = None
) -> Quota:
    """A 429 (to `attempt`, a job and its attempt, if known): closed until `delay_s` from now
    (never sooner than it was closed until); a 429 within a window of the previous one
    lowers the effective rate (multiplicative decrease); and what it says of the provider's
    window caps it (`_room_said`)."""
    q = recovered(q, now)
    until = now + timedelta(seconds=delay_s)
    if q.closed_until is not None and q.closed_until > until:
        until = q.closed_until
    span = timedelta(seconds=q.longest_s())
    if _in_flight_then(q, attempt, now):
        # The calls in flight when the quota closed answer 429 too (while it is closed, or
        # after a short delay, a call charged before the last 429): one burst, one strike.
        factor = min(q.factor, _room_said(q, until, now))
        return replace(q, closed_until=until, factor=factor, last_429=now, calm_since=until)
    factor = min(q.factor, _room_said(q, until, now))
    if _at_limit(q, now):
        # The window held all its limit by Brook's count: the estimates in flight were a
        # little short, the limit is not in doubt. Closed, no strike. But a limit that 429s
        # had lowered already (by more than a bucket's share) was set a little high by
        # them: shaved (`SHAVE`), so that it does not meet the provider's in every window.
        if q.factor < 1.0 - 1.0 / BUCKETS:
            factor = max(FLOOR, factor * SHAVE)
        return replace(q, closed_until=until, factor=factor, last_429=now, calm_since=until)
    strikes = q.strikes + 1 if q.last_429 is not None and now - q.last_429 <= span else 1
    if strikes >= 2 and factor > q.factor * (1 - 1 / BUCKETS):
        # A repeat that says nothing of the provider's window the rate did not hold: x
        # DECREASE. One whose window says less (by more than a bucket's share) is taken at
        # its word: lowered by both, a provider that halved its limit was left a sixth unused.
        factor = max(FLOOR, q.factor * DECREASE)
    return replace(
        q, closed_until=until, strikes=strikes, factor=factor, last_429=now, calm_since=until
    )


def _at_limit(q: Quota, now: datetime) -> bool:
    """Whether the units window holds its effective limit, less a bucket's share, by
    Brook's count (the starts in flight at estimate x usage ratio)."""
    limit = q.effective("units")
    if limit is None:
        return False
    return q.used("units", now) + q.in_flight_extra(now) >= limit * (1 - 1 / BUCKETS)


def _in_flight_then(q: Quota, attempt: tuple[str, int] | None, now: datetime) -> bool:
    """Whether this 429 belongs to the burst of the previous one: the quota is still closed,
    or the attempt was charged no later than the bucket of the previous 429."""
    if q.closed_until is not None and q.closed_until > now:
        return True
    if attempt is None or q.last_429 is None:
        return False
    held = next((h for h in q.holders if (h.job, h.attempt) == attempt), None)
    w = q.units or q.requests
    if held is None or held.t is None or w is None:
        return False
    return held.t <= w.bucket(_aware(q.last_429))


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _room_said(q: Quota, until: datetime, now: datetime) -> float:
    """What a 429 says of the provider's limit, as a share of the units limit: its window is
    full now and has room again at `until`, so it allows about what the units window will
    still hold then (the starts in flight, which report later, at their estimate x the
    usage ratio), never below `FLOOR`. 1 without a units window."""
    w = q.units
    if w is None:
        return 1.0
    held = q.used_through("units", until) + q.in_flight_extra(until)
    return min(max(held / w.limit, FLOOR), 1.0)
