import pytest

from app.clients.breaker import BreakerState, CircuitBreaker
from app.core.errors import FailureKind, FeatureStoreError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _breaker(clock: Clock, states: list[BreakerState] | None = None) -> CircuitBreaker:
    sink = states if states is not None else []
    return CircuitBreaker("redis", failures=3, open_s=1.0, clock=clock, on_change=sink.append)


def _fail(breaker: CircuitBreaker, kind: FailureKind = FailureKind.TIMEOUT) -> None:
    with pytest.raises(FeatureStoreError), breaker.guard(FeatureStoreError):
        raise FeatureStoreError(kind, "down")


def _succeed(breaker: CircuitBreaker) -> None:
    with breaker.guard(FeatureStoreError):
        pass


def test_closed_lets_calls_through_and_forgets_failures_after_a_success() -> None:
    breaker = _breaker(Clock())
    _fail(breaker)
    _fail(breaker)
    _succeed(breaker)
    _fail(breaker)
    _fail(breaker)
    assert breaker.state is BreakerState.CLOSED


def test_consecutive_failures_open_it_and_calls_then_fail_fast() -> None:
    states: list[BreakerState] = []
    breaker = _breaker(Clock(), states)
    for _ in range(3):
        _fail(breaker, FailureKind.UNAVAILABLE)
    assert breaker.state is BreakerState.OPEN
    assert states == [BreakerState.OPEN]
    with pytest.raises(FeatureStoreError) as raised, breaker.guard(FeatureStoreError):
        pytest.fail("an open breaker must not run the call")
    assert raised.value.kind is FailureKind.CIRCUIT_OPEN


def test_bad_data_and_overload_do_not_count_against_the_dependency() -> None:
    breaker = _breaker(Clock())
    for _ in range(5):
        _fail(breaker, FailureKind.BAD_DATA)
        _fail(breaker, FailureKind.OVERLOADED)
    assert breaker.state is BreakerState.CLOSED


def test_after_the_open_period_one_probe_goes_out_and_its_success_closes() -> None:
    clock = Clock()
    states: list[BreakerState] = []
    breaker = _breaker(clock, states)
    for _ in range(3):
        _fail(breaker)
    clock.now += 0.999
    assert not breaker.allow()
    clock.now += 0.002
    assert breaker.allow()  # the probe
    assert breaker.state is BreakerState.HALF_OPEN
    assert not breaker.allow()  # only one probe at a time
    breaker.succeeded()
    assert states[-1] is BreakerState.CLOSED
    assert states == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]


def test_a_failed_probe_opens_it_for_another_period() -> None:
    clock = Clock()
    breaker = _breaker(clock)
    for _ in range(3):
        _fail(breaker)
    clock.now += 1.5
    _fail(breaker)  # the probe
    assert breaker.state is BreakerState.OPEN
    clock.now += 0.5
    assert not breaker.allow()
    clock.now += 0.6
    assert breaker.allow()


def test_a_probe_that_ends_without_a_verdict_lets_the_next_call_probe() -> None:
    clock = Clock()
    breaker = _breaker(clock)
    for _ in range(3):
        _fail(breaker)
    clock.now += 2
    with pytest.raises(KeyError), breaker.guard(FeatureStoreError):
        raise KeyError("cancelled, say")
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()


def test_timeouts_while_excused_do_not_open_it_but_unavailable_answers_do() -> None:
    late = [True]
    breaker = CircuitBreaker("redis", failures=2, open_s=1.0, excused=lambda: late[0])
    for _ in range(5):
        _fail(breaker, FailureKind.TIMEOUT)
    assert breaker.allow()
    _fail(breaker, FailureKind.UNAVAILABLE)
    _fail(breaker, FailureKind.UNAVAILABLE)
    assert breaker.state is BreakerState.OPEN
