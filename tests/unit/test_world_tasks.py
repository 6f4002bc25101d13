"""Stopping a world's tasks: a swallowed cancellation is sent again; a task that will not
stop is left behind rather than holding up a retirement or a shutdown."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from app.process.world_tasks import stop_tasks


async def _swallows_once(stopped: list[str]) -> None:
    # As a client's read can: the first cancellation is caught and the loop goes on.
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(3600)
    try:
        await asyncio.sleep(3600)
    finally:
        stopped.append("swallower")


async def _never_stops(released: asyncio.Event) -> None:
    """Swallows every cancellation until the test releases it."""
    while not released.is_set():
        try:
            await released.wait()
        except asyncio.CancelledError:
            continue


@pytest.mark.asyncio
async def test_a_swallowed_cancellation_is_sent_again() -> None:
    stopped: list[str] = []
    task = asyncio.create_task(_swallows_once(stopped))
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_tasks([task], timeout_s=5.0), 5.0)
    assert task.done()
    assert stopped == ["swallower"]


@pytest.mark.asyncio
async def test_a_task_that_will_not_stop_is_left_behind_in_time() -> None:
    released = asyncio.Event()
    stubborn = asyncio.create_task(_never_stops(released))
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_tasks([stubborn], timeout_s=1.0), 5.0)
    assert not stubborn.done()
    released.set()  # the session's loop must not keep it
    await asyncio.wait_for(stubborn, 5.0)
