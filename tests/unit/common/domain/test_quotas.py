"""A quota's arithmetic without a database: admission, the burst cap, the usage ratio, what a
429 says, and the adaptive rule."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from brook.common.domain.quotas import (
    BUCKETS,
    BURST,
    DECREASE,
    FLOOR,
    RATIO_MAX,
    SHAVE,
    Bucket,
    Holder,
    Quota,
    Refused,
    Start,
    Window,
    admit,
    learned,
    rate_limited,
    recovered,
)

# A whole bucket's start (3 s buckets of a 60 s window), so a test's moments stay in it.
T0 = datetime.fromtimestamp(3 * 1_000_000, UTC)


def units(limit: int = 400_000) -> Quota:
    """A quota of `limit` units a minute that has learned its estimates are right."""
    return Quota(
        name="model",
        units=Window(limit=limit, per_seconds=60.0),
        learned_est=1000.0,
        learned_used=1000.0,
    )


def start(job: str, cost: int = 1000, key: str | None = None) -> Start:
    return Start(job=job, attempt=1, owner="d1", key=key, cost=cost)


def fill(q: Quota, n: int, now: datetime, cost: int = 1000, key: str | None = None) -> Quota:
    """`n` starts admitted at `now` (each a new job)."""
    for i in range(n):
        out = admit(q, start(f"{key or 'j'}{now.timestamp()}-{i}", cost, key), now)
        assert isinstance(out, Quota), out
        q = out
    return q


def test_one_bucket_admits_at_most_the_burst_share_of_the_window_then_the_next_bucket_more() -> (
    None
):
    q = units()
    share = 400_000 * BURST // BUCKETS  # 40,000: 40 starts of 1,000
    q = fill(q, share // 1000, T0)
    out = admit(q, start("over"), T0 + timedelta(seconds=2.9))
    assert isinstance(out, Refused) and out.reason == "units"
    assert out.retry_at == (T0 + timedelta(seconds=3)).timestamp()  # the next bucket
    assert isinstance(admit(q, start("next"), T0 + timedelta(seconds=3)), Quota)


def test_a_window_admits_up_to_its_limit_and_holds_a_start_until_room_ages_out() -> None:
    q = units(10_000)
    for b in range(BUCKETS):  # one start a bucket: the window fills without a burst
        q = fill(q, 1, T0 + timedelta(seconds=3 * b), cost=500)
    now = T0 + timedelta(seconds=59)
    out = admit(q, start("late", 500), now)
    assert isinstance(out, Refused) and out.reason == "units"
    # The first bucket stops counting 63 s after it began (a window plus one bucket).
    assert out.retry_at == (T0 + timedelta(seconds=63)).timestamp()


def test_the_usage_ratio_is_learned_from_reports_bounded_and_starts_at_one() -> None:
    q = replace(units(), learned_est=0.0, learned_used=0.0)
    assert q.usage_ratio() == 1.0
    # 100 attempts estimated at 1,000 reported 1,250 each.
    q = replace(q, learned_est=100_000.0, learned_used=125_000.0)
    prior = 0.02 * 400_000
    assert q.usage_ratio() == (125_000 + prior) / (100_000 + prior)
    assert replace(q, learned_used=50_000.0).usage_ratio() == 1.0  # never below 1
    assert replace(q, learned_used=10**9).usage_ratio() == RATIO_MAX


def test_a_report_teaches_the_ratio_its_estimate_once_and_each_later_report_what_it_added() -> None:
    h = Holder(job="j", attempt=1, owner="d", key=None, units=1000.0, t=1, estimate=1000.0)
    assert learned(h, 1300.0) == (1000.0, 1300.0)
    again = replace(h, units=1300.0, reported=True)
    assert learned(again, 1500.0) == (0.0, 200.0)
    old = replace(h, estimate=None)  # a hold stored before estimates were kept
    assert learned(old, 800.0) == (1000.0, 800.0)


def test_starts_in_flight_count_at_their_estimate_times_the_ratio_so_the_window_is_not_overfilled() -> (
    None
):
    t = Window(limit=1, per_seconds=60.0).bucket(T0)
    # 60 starts of 1,000 charged on their estimates, not reported yet; 24,000 reported.
    holders = tuple(
        Holder(job=f"j{i}", attempt=1, owner="d", key=None, units=1000.0, t=t, estimate=1000.0)
        for i in range(60)
    )
    held = (Bucket(t=t, n=60_000.0), Bucket(t=t + 1, n=24_000.0))
    q = replace(units(100_000), buckets={"units": held}, holders=holders)
    now = T0 + timedelta(seconds=20)
    assert isinstance(admit(q, start("next"), now), Quota)  # 84,000 + 1,000 (ratio 1)
    # The reports so far say 1.25 (near enough, with the prior): the 60 in flight will
    # report about 75,000, and the next start about 1,250: no room.
    learned_q = replace(q, learned_est=400_000.0, learned_used=500_000.0)
    out = admit(learned_q, start("next"), now)
    assert isinstance(out, Refused) and out.reason == "units"


def test_the_ratio_sums_are_halved_once_their_estimates_pass_a_window() -> None:
    q = replace(units(10_000), learned_est=10_000.0, learned_used=12_000.0)
    assert q.usage_ratio() > 1
    out = admit(q, start("j"), T0)
    assert isinstance(out, Quota) and (out.learned_est, out.learned_used) == (10_000.0, 12_000.0)
    out = admit(replace(q, learned_est=10_001.0), start("j"), T0)
    assert isinstance(out, Quota) and (out.learned_est, out.learned_used) == (5_000.5, 6_000.0)


def test_a_lone_429_closes_the_quota_and_a_repeat_within_a_window_lowers_its_rate() -> None:
    q = Quota(name="model", requests=Window(limit=1000, per_seconds=60.0))
    q = rate_limited(q, 5.0, T0)
    assert q.closed_until == T0 + timedelta(seconds=5) and q.factor == 1.0 and q.strikes == 1
    # A call in flight while it is closed answers 429 too: the same strike.
    q = rate_limited(q, 5.0, T0 + timedelta(seconds=1))
    assert q.factor == 1.0 and q.strikes == 1
    q = rate_limited(q, 5.0, T0 + timedelta(seconds=10))
    assert q.strikes == 2 and q.factor == DECREASE
    # Each calm window adds a tenth of the limits back.
    later = recovered(q, T0 + timedelta(seconds=15 + 60))
    assert later.factor == DECREASE + 0.1 and later.strikes == 0


def test_a_429_caps_the_rate_at_what_the_units_window_holds_when_the_provider_has_room() -> None:
    # 200,000 units charged 40 s ago, 200,000 now: the provider (its limit halved, telling
    # no one) says room opens in 30 s, when the older half has aged out.
    t = Window(limit=1, per_seconds=60.0).bucket(T0)
    held = (Bucket(t=t, n=200_000.0), Bucket(t=t + 13, n=200_000.0))
    q = replace(units(400_000), buckets={"units": held})
    now = T0 + timedelta(seconds=40)
    out = rate_limited(q, 30.0, now)
    # The window held its whole limit by Brook's count: no strike, but the cap.
    assert out.factor == 0.5 and out.strikes == 0
    # A provider whose window is not ours to judge (nothing of ours left then): the floor.
    assert rate_limited(q, 70.0, now).factor == FLOOR
    # A 429 while the window holds what the limit allows says nothing new.
    assert rate_limited(q, 0.5, now).factor == 1.0


def test_a_429_to_a_call_charged_before_the_last_429_is_the_same_burst_whatever_the_delay() -> None:
    w = Window(limit=1000, per_seconds=60.0)
    t = w.bucket(T0)
    early = Holder(job="early", attempt=1, owner="d", key=None, units=1.0, t=t)
    late = Holder(job="late", attempt=1, owner="d", key=None, units=1.0, t=t + 2)
    q = Quota(name="model", requests=w, holders=(early, late))
    q = rate_limited(q, 0.2, T0)  # a short Retry-After: closed 0.2 s
    q = rate_limited(q, 0.2, T0 + timedelta(seconds=10), ("late", 1))
    assert q.strikes == 2 and q.factor == DECREASE
    # Answered later still, but charged before that 429: in flight then, the same burst.
    q = rate_limited(q, 0.2, T0 + timedelta(seconds=12), ("early", 1))
    assert q.strikes == 2 and q.factor == DECREASE
    assert q.closed_until == T0 + timedelta(seconds=12.2)


def test_a_start_that_has_not_reported_counts_until_it_reports_though_its_bucket_aged_out() -> None:
    w = Window(limit=10_000, per_seconds=60.0)
    t = w.bucket(T0)
    # Charged 70 s ago (it waited for a worker), not reported: its call may be now.
    slow = Holder(job="slow", attempt=1, owner="d", key=None, units=6000.0, t=t, estimate=6000.0)
    q = replace(units(10_000), buckets={"units": (Bucket(t=t, n=6000.0),)}, holders=(slow,))
    now = T0 + timedelta(seconds=70)
    assert q.used("units", now) == 0.0 and q.in_flight_extra(now) == 6000.0
    out = admit(q, start("next", 5000), now)
    assert isinstance(out, Refused) and out.reason == "units"
    assert isinstance(admit(q, start("next", 4000), now), Quota)


def test_before_its_first_report_a_quota_admits_at_most_half_its_window_on_estimates_alone() -> (
    None
):
    q = replace(units(100_000), learned_est=0.0, learned_used=0.0)
    for b in range(5):  # 50 starts of 1,000, a bucket's burst share at a time
        q = fill(q, 10, T0 + timedelta(seconds=3 * b))
    now = T0 + timedelta(seconds=15)
    out = admit(q, start("51st"), now)
    assert isinstance(out, Refused) and out.reason == "units"
    # One report (of its estimate) and the window's limit is the bound again.
    first = q.holders[0]
    reported = replace(first, reported=True)
    learned_q = replace(
        q, holders=(reported, *q.holders[1:]), learned_est=1000.0, learned_used=1000.0
    )
    assert isinstance(admit(learned_q, start("51st"), now), Quota)


def test_while_429s_hold_the_rate_down_a_bucket_admits_only_the_even_pace() -> None:
    q = replace(units(), last_429=T0 - timedelta(seconds=30), factor=0.5)
    q = fill(q, 200_000 // BUCKETS // 1000, T0)  # 10 starts: one bucket's share
    out = admit(q, start("over"), T0)
    assert isinstance(out, Refused) and out.reason == "units"
    # A window later the rate is still below the limit (stepping back up): the even pace
    # holds, so the step probes the provider with a bucket's share.
    later = replace(q, last_429=T0 - timedelta(seconds=61))
    out = admit(later, start("over"), T0)
    assert isinstance(out, Refused) and out.reason == "units"
    whole = replace(q, factor=1.0)  # a 429 that lowered nothing: no doubt about the limit
    assert isinstance(admit(whole, start("over"), T0), Quota)


def test_a_429_while_the_window_holds_its_whole_limit_is_no_strike() -> None:
    t = Window(limit=1, per_seconds=60.0).bucket(T0)
    full = replace(units(400_000), buckets={"units": (Bucket(t=t, n=399_000.0),)})
    q = rate_limited(full, 1.0, T0 + timedelta(seconds=10))
    q = rate_limited(q, 1.0, T0 + timedelta(seconds=20))
    assert q.strikes == 0 and q.factor == 399_000 / 400_000 and q.closed_until is not None
    # Below its limit by Brook's count, the provider refused: a strike (and the cap).
    half = replace(units(400_000), buckets={"units": (Bucket(t=t, n=200_000.0),)})
    q = rate_limited(half, 0.1, T0 + timedelta(seconds=10))
    assert q.strikes == 1 and q.factor == 0.5


def test_the_even_pace_counts_starts_at_their_estimate_times_the_usage_ratio() -> None:
    # Reports said 1.25 x the estimates: one bucket's share of 200,000 (10,000) is 8 starts
    # of 1,000, not 10 (which used 12,500 and refilled a halved provider past its limit).
    q = replace(
        units(),
        learned_est=392_000.0,
        learned_used=492_000.0,
        last_429=T0 - timedelta(seconds=30),
        factor=0.5,
    )
    assert q.usage_ratio() == 1.25
    q = fill(q, 7, T0)  # 8,750 as admission counts them
    out = admit(q, start("1,100", cost=1100), T0)  # 1,375: past the pace
    assert isinstance(out, Refused) and out.reason == "units"
    q = fill(q, 1, T0 + timedelta(seconds=0.5))
    out = admit(q, start("9th"), T0 + timedelta(seconds=1))
    assert isinstance(out, Refused) and out.reason == "units"


def test_a_429_reads_the_oldest_bucket_of_the_providers_window_in_part() -> None:
    # 200,000 charged over the bucket from T0 to T0+3 s, 100,000 at T0+30 s. A 429 at
    # T0+40 s says the provider has room at T0+61.5 s: its window then starts at T0+1.5 s,
    # half way through the first bucket, so it holds about 100,000 + 100,000.
    t = Window(limit=1, per_seconds=60.0).bucket(T0)
    q = replace(
        units(400_000),
        buckets={"units": (Bucket(t=t, n=200_000.0), Bucket(t=t + 10, n=100_000.0))},
    )
    out = rate_limited(q, 21.5, T0 + timedelta(seconds=40))
    assert out.strikes == 1
    assert abs(out.factor - 0.5) < 1e-9


def test_a_429_at_a_limit_429s_had_lowered_shaves_it() -> None:
    # The rate found at half the limit, and Brook's window holds that half: a 429 now says
    # the half was a little high (the provider's window met it), so it is shaved, no strike.
    t = Window(limit=1, per_seconds=60.0).bucket(T0)
    q = replace(
        units(400_000),
        factor=0.5,
        last_429=T0 - timedelta(seconds=100),
        calm_since=T0 - timedelta(seconds=50),
        buckets={"units": (Bucket(t=t, n=200_000.0),)},
    )
    out = rate_limited(q, 1.0, T0 + timedelta(seconds=5))
    assert out.strikes == 0
    assert abs(out.factor - 0.5 * SHAVE) < 1e-9


def test_a_repeat_429_whose_window_says_less_is_taken_at_its_word_not_lowered_again() -> None:
    # The rate at 0.59 after a first 429; 54 s later, a second, when Brook's window holds
    # 200,000 (under the 236,000 allowed): the provider's limit is half. Taken as 0.5, not
    # 0.59 x DECREASE (0.413), which would leave a halved provider a sixth unused.
    t = Window(limit=1, per_seconds=60.0).bucket(T0)
    q = replace(
        units(400_000),
        factor=0.59,
        strikes=1,
        last_429=T0 - timedelta(seconds=54),
        calm_since=T0 - timedelta(seconds=50),
        buckets={"units": (Bucket(t=t, n=200_000.0),)},
    )
    out = rate_limited(q, 1.0, T0 + timedelta(seconds=1))
    assert out.strikes == 2
    assert abs(out.factor - 0.5) < 1e-9
