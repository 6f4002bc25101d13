"""Whether this task was asked to stop, for loops that run until cancelled."""

from __future__ import annotations

import asyncio


def cancel_requested() -> bool:
    """Whether this task was asked to stop, even when the CancelledError itself got lost.

    A cancel that lands inside a Redis call while its timeout is also due (as when the
    event loop resumes after standing still) can be swallowed on the way out; a loop
    that refreshes until cancelled would then refresh forever, and shutdown, which waits
    for it, would never end.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
