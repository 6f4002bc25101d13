"""Admission: the adaptive limit, the short line for bursts, and the loop's standing lag."""

from __future__ import annotations

import asyncio

import pytest

from app.process.admission import Admission, OverloadedError
from app.process.concurrency_limit import MIN_SAMPLES, WINDOW_S, AdaptiveLimit
from app.process.loop_lag import STANDING_SAMPLES, LoopLag


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _limit(clock: Clock, initial: int = 8, floor: int = 2, ceiling: int = 32) -> AdaptiveLimit:
    return AdaptiveLimit(initial, floor, ceiling, max_latency_s=0.025, clock=clock)


def _window(limit: AdaptiveLimit, clock: Clock, latency_s: float, demand: bool) -> None:
    """One window of answers, all taking `latency_s`."""
    limit.note_arrival(full=demand)
    clock.now += WINDOW_S * 1.01
    for _ in range(MIN_SAMPLES):
        limit.observe(latency_s)


def test_the_limit_climbs_while_latency_holds_and_demand_reaches_it() -> None:
    clock = Clock()
    limit = _limit(clock)
    _window(limit, clock, 0.004, demand=False)  # the baseline: 4 ms
    assert limit.current == 8  # no demand: nothing to learn about more
    for _ in range(5):
        _window(limit, clock, 0.010, demand=True)  # within 3x the baseline
    assert limit.current == 13


def test_latency_past_the_target_shrinks_the_limit_in_proportion() -> None:
    clock = Clock()
    limit = _limit(clock, initial=20)
    _window(limit, clock, 0.004, demand=False)
    _window(limit, clock, 0.015, demand=True)  # over the 12 ms target, once: noise
    assert limit.current == 20
    _window(limit, clock, 0.015, demand=True)  # twice running: 0.8 of the limit stays
    assert limit.current == 16
    _window(limit, clock, 0.2, demand=True)  # far over: halved at most
    assert limit.current == 8
    for _ in range(10):
        _window(limit, clock, 0.2, demand=True)
    assert limit.current == 2  # never under the floor


def test_latency_that_rose_while_slots_stood_free_leaves_the_limit() -> None:
    clock = Clock()
    limit = _limit(clock, initial=8)
    _window(limit, clock, 0.004, demand=False)
    for _ in range(5):  # a slow dependency: answers take longer, the worker is not full
        _window(limit, clock, 0.040, demand=False)
    assert limit.current == 8


def test_the_target_never_exceeds_the_latency_ceiling() -> None:
    clock = Clock()
    limit = _limit(clock, initial=10)
    _window(limit, clock, 0.020, demand=False)  # a slow baseline: 3x would be 60 ms
    assert limit.target_s() == pytest.approx(0.025)
    _window(limit, clock, 0.030, demand=True)
    _window(limit, clock, 0.030, demand=True)
    assert limit.current == 8


def test_a_burst_of_overload_cannot_talk_the_baseline_up() -> None:
    clock = Clock()
    limit = _limit(clock)
    _window(limit, clock, 0.004, demand=False)
    for _ in range(10):  # a couple of seconds of queueing
        _window(limit, clock, 0.020, demand=True)
    assert limit.baseline_s == pytest.approx(0.004)
    assert limit.current == 2


def test_a_machine_that_became_slower_raises_the_baseline_within_seconds() -> None:
    clock = Clock()
    limit = _limit(clock)
    _window(limit, clock, 0.004, demand=False)
    for _ in range(40):  # ten seconds at 12 ms: another process took a core
        _window(limit, clock, 0.012, demand=False)
    assert limit.baseline_s == pytest.approx(0.012)
    assert limit.target_s() == pytest.approx(0.025)  # 3x, within the ceiling


def test_a_window_needs_enough_answers() -> None:
    clock = Clock()
    limit = _limit(clock)
    limit.note_arrival(full=True)
    clock.now += 10 * WINDOW_S
    for _ in range(MIN_SAMPLES - 1):
        limit.observe(0.5)
    assert limit.current == 8
    assert limit.baseline_s is None


def _admission(limit: int = 2, max_queue_s: float = 0.05, lag: LoopLag | None = None) -> Admission:
    counts: list[int] = []
    adaptive = AdaptiveLimit(limit, 1, limit, max_latency_s=1.0)
    return Admission(adaptive, lag or LoopLag(), max_queue_s, on_change=counts.append)


async def test_a_burst_waits_in_line_and_is_served_in_order() -> None:
    admission = _admission(limit=2)
    await admission.enter()
    await admission.enter()
    order: list[int] = []

    async def arrive(n: int) -> None:
        await admission.enter()
        order.append(n)

    waiting = [asyncio.create_task(arrive(n)) for n in (1, 2)]
    await asyncio.sleep(0)
    assert admission.in_flight == 2
    assert order == []
    admission.leave(0.001)
    admission.leave(0.001)
    await asyncio.gather(*waiting)
    assert order == [1, 2]
    assert admission.in_flight == 2  # the slots passed on, none freed in between


async def test_a_wait_that_runs_out_is_refused_and_leaves_no_trace() -> None:
    admission = _admission(limit=1, max_queue_s=0.01)
    await admission.enter()
    with pytest.raises(OverloadedError, match="no slot came free within 10 ms"):
        await admission.enter()
    admission.leave()
    assert admission.in_flight == 0
    await admission.enter()  # the next one is taken at once
    assert admission.in_flight == 1


async def test_once_the_worker_stays_full_refusals_come_at_once() -> None:
    admission = _admission(limit=1, max_queue_s=10.0)
    await admission.enter()
    admission.limit.saturated = True  # most requests of the last window found it full
    with pytest.raises(OverloadedError, match="1 requests in flight and 0 waiting"):
        await asyncio.wait_for(admission.enter(), 1.0)


async def test_a_cancelled_waiter_gives_back_a_slot_it_was_handed() -> None:
    admission = _admission(limit=1)
    await admission.enter()
    waiter = asyncio.create_task(admission.enter())
    await asyncio.sleep(0)
    admission.leave()  # hands the slot to the waiter...
    waiter.cancel()  # ...whose client goes away before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.in_flight == 0


def test_the_standing_lag_ignores_a_stall_and_reads_a_loop_that_stays_behind() -> None:
    lag = LoopLag()
    lag.observe(0.2)  # one stall: start-up's last steps, a collection
    for _ in range(STANDING_SAMPLES - 1):
        lag.observe(0.0)
    assert lag.standing_s == 0.0
    assert lag.lag_s > 0  # still dates the requests it delayed
    for _ in range(STANDING_SAMPLES):
        lag.observe(0.03)
    assert lag.standing_s == pytest.approx(0.03)


async def test_a_loop_that_stays_behind_refuses_new_requests() -> None:
    lag = LoopLag()
    admission = _admission(limit=8, max_queue_s=0.02, lag=lag)
    for _ in range(STANDING_SAMPLES):
        lag.observe(0.05)
    with pytest.raises(OverloadedError, match="requests wait 50 ms before they are read"):
        await admission.enter()
    assert 0.02 < admission.queued_s <= 0.05


async def test_time_spent_unread_comes_out_of_the_wait_in_line() -> None:
    lag = LoopLag()
    admission = _admission(limit=1, max_queue_s=0.05, lag=lag)
    await admission.enter()
    lag.lag_s = 0.04  # requests are read 40 ms late: 10 ms of the allowance is left
    with pytest.raises(OverloadedError, match="no slot came free within 10 ms"):
        await admission.enter()
    lag.lag_s = 0.06  # read later than the whole allowance: refused without waiting
    with pytest.raises(OverloadedError, match="requests wait 60 ms before they are read"):
        await asyncio.wait_for(admission.enter(), 0.001)
    assert admission.in_flight == 1
