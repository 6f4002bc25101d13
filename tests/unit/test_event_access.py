"""Who may post events, as pure logic: the callers list, tokens by digest, the quota's
bucket, and the consumer's rule for what may move trending."""

from __future__ import annotations

import pytest
from redis import exceptions as redis_errors

from app.clients.event_stream import transient
from app.core.callers import entry, new_token, parse_callers, token_digest
from app.core.token_bucket import TokenBuckets
from app.ingest.consumer import _TrendingBudget


def test_a_caller_is_found_by_its_token_and_only_the_digest_is_kept() -> None:
    shop, app = new_token(), new_token()
    callers = parse_callers(f"{entry('shop', shop)}, {entry('app', app)}")
    assert callers.who(shop) == "shop"
    assert callers.who(app) == "app"
    assert callers.who("") is None
    assert callers.who(shop + "x") is None
    assert shop not in repr(callers)
    assert set(callers.by_digest) == {token_digest(shop), token_digest(app)}
    assert callers.names == ["app", "shop"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "names no caller"),
        ("shop=plain-token", "expected name=sha256"),
        (f"Shop=sha256:{'0' * 64}", "caller name"),
        (f"loopback=sha256:{'0' * 64}", "caller name"),
        (f"a=sha256:{'0' * 64},a=sha256:{'1' * 64}", "listed twice"),
        (f"a=sha256:{'0' * 64},b=sha256:{'0' * 64}", "same token"),
    ],
)
def test_a_bad_callers_list_is_refused_naming_the_entry(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_callers(text)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_takes_a_burst_then_the_rate_and_says_how_long_to_wait() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=10.0, burst=100.0, clock=clock)
    assert buckets.take("shop", 100) == 0.0
    assert buckets.take("shop", 10) == pytest.approx(1.0)  # nothing left: 10 at 10/s
    assert buckets.take("app", 50) == 0.0  # a bucket per caller
    clock.now = 0.5
    assert buckets.take("shop", 5) == 0.0
    assert buckets.take("shop", 1) == pytest.approx(0.1)
    assert buckets.take("shop", 101) == float("inf")  # never fits
    clock.now = 1000.0
    assert buckets.take("shop", 100) == 0.0  # refilled to the burst, no further
    assert buckets.take("shop", 1) > 0.0


def test_a_user_moves_trending_a_few_times_a_minute_then_only_themselves() -> None:
    budget = _TrendingBudget(per_minute=3)
    allowed = [budget.allows("u1", 10.0) for _ in range(5)]
    assert allowed == [True, True, True, False, False]
    assert budget.allows("u2", 10.0)
    assert budget.allows("u1", 61.0)  # a new minute
    assert all(_TrendingBudget(per_minute=0).allows("u1", 1.0) for _ in range(100))


def test_only_an_unreachable_busy_or_full_redis_is_waited_out() -> None:
    assert transient(redis_errors.ConnectionError("gone"))
    assert transient(redis_errors.TimeoutError("slow"))
    assert transient(redis_errors.BusyLoadingError("loading"))
    assert transient(redis_errors.ResponseError("OOM command not allowed when used memory"))
    assert transient(redis_errors.ReadOnlyError("READONLY replica"))
    assert not transient(redis_errors.ResponseError("WRONGTYPE Operation against a key"))
    assert not transient(ValueError("a bug"))
