"""Past capacity and at shutdown, against the API as its own process under open-loop load."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import httpx
import pytest

from loadtest.openloop import run
from loadtest.overload import overload
from tests.integration.conftest import Stack
from tests.integration.test_faults import BUDGET_MS, api_process, steady_load

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

MAX_IN_FLIGHT = 8


async def test_three_times_capacity_is_shed_fast_and_the_rest_served_in_budget(
    stack: Stack, tmp_path: Path
) -> None:
    with api_process(stack, tmp_path, max_in_flight=str(MAX_IN_FLIGHT)) as api:
        load = steady_load(api)
        await run(load, 50, 1.0)  # warm the pools and the model
        rss_before = api.rss_bytes()
        outcome = await overload(load, MAX_IN_FLIGHT, factor=3.0, duration_s=4.0)
        rss_growth = api.rss_bytes() - rss_before
    print(dataclasses.asdict(outcome), rss_growth)
    assert set(outcome.statuses) == {"200", "503"}, outcome
    assert not outcome.errors, outcome
    assert outcome.shed_with_retry_after == outcome.statuses["503"]
    assert outcome.admitted_p99_ms is not None
    assert outcome.admitted_p99_ms <= BUDGET_MS
    # Refusals come fast, not after a wait. (The benchmark reports the figure; on a busy
    # 2-core machine the generator's own lateness is in it, hence the slack here.)
    assert outcome.shed_p99_ms is not None
    assert outcome.shed_p99_ms <= 25.0, outcome
    # An unprotected service serves a fraction of its capacity at 3x (every request slow,
    # most timing out); this guards against that collapse. The benchmark (make
    # bench-overload) reports the share against its 90% target: capacity measured over 3 s
    # on a shared 2-core machine varies by +-15% from run to run.
    assert outcome.goodput_share >= 0.7, outcome
    assert rss_growth < 30 * 2**20, f"memory grew by {rss_growth} bytes under overload"


async def _until_not_ready(client: httpx.AsyncClient) -> None:
    for _ in range(100):
        if (await client.get("/readyz")).status_code == 503:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("readiness never failed after SIGTERM")


async def test_sigterm_drains_without_failing_a_request(stack: Stack, tmp_path: Path) -> None:
    drain_s, grace_s = 1.0, 5.0
    with api_process(stack, tmp_path, drain_s=str(drain_s), shutdown_grace_s=str(grace_s)) as api:
        stop = asyncio.Event()
        traffic = asyncio.create_task(run(steady_load(api), 50, 10.0, stop=stop))
        await asyncio.sleep(1.0)
        api.terminate()
        signalled = time.monotonic()
        # A load balancer polling readiness takes the instance out of rotation.
        async with httpx.AsyncClient(base_url=api.url, timeout=1.0) as client:
            await _until_not_ready(client)
        not_ready_after = time.monotonic() - signalled
        stop.set()
        result = await traffic
        status = await asyncio.to_thread(api.process.wait, drain_s + grace_s + 5.0)
        stopped_after = time.monotonic() - signalled
    records = result.records
    assert not_ready_after < 0.5
    assert status == 0, api.log_tail()
    assert stopped_after <= drain_s + grace_s + 1.0
    assert len(records) >= 50
    failed = [r for r in records if r.status != 200]
    assert not failed, failed[:5]
