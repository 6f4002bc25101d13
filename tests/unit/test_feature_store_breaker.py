"""The Redis client's guards that need no Redis: a call it must never make."""

from typing import Any

import pytest

from app.clients.breaker import BreakerState, CircuitBreaker
from app.clients.feature_store import FeatureStore
from app.core.errors import FailureKind, FeatureStoreError
from app.release.keyspace import KeySpace
from tests.unit.tiny_schema import tiny_schema


class _Untouchable:
    def pipeline(self, **kwargs: Any) -> Any:
        raise AssertionError("Redis must not be called")


def _store(breaker: CircuitBreaker) -> FeatureStore:
    return FeatureStore(_Untouchable(), tiny_schema(), KeySpace("t"), breaker)  # type: ignore[arg-type]


async def test_an_open_breaker_fails_the_call_without_calling_redis() -> None:
    breaker = CircuitBreaker("redis", failures=1, open_s=60.0)
    breaker.failed()
    with pytest.raises(FeatureStoreError) as raised:
        await _store(breaker).user("u1", 0.02)
    assert raised.value.kind is FailureKind.CIRCUIT_OPEN
    with pytest.raises(FeatureStoreError):
        await _store(breaker).items([b"t:i:a"], 0.02)


async def test_a_spent_budget_fails_without_calling_redis_or_blaming_it() -> None:
    breaker = CircuitBreaker("redis", failures=1, open_s=60.0)
    with pytest.raises(FeatureStoreError) as raised:
        await _store(breaker).user("u1", 0.0)
    assert raised.value.kind is FailureKind.TIMEOUT
    assert breaker.state is BreakerState.CLOSED
