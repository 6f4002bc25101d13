"""Past capacity, through a stall and at shutdown, against the API as its own process."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from loadtest.closedloop import closed_loop
from loadtest.openloop import run
from loadtest.overload import overload
from tests.integration.conftest import Stack
from tests.integration.test_faults import (
    BUDGET_MS,
    MARGIN_MS,
    api_process,
    item_count_and_flags,
    steady_load,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_three_times_capacity_is_shed_fast_and_the_rest_served_in_budget(
    stack: Stack, tmp_path: Path
) -> None:
    with api_process(stack, tmp_path) as api:
        load = steady_load(api)
        await run(load, 50, 1.0)  # warm the pools, the model and the limit's baseline
        # What two connections get answered, one after the other: never refused (the
        # limit's floor is two), and close to what the worker can do on this machine now.
        reference = await closed_loop(load, 2, 2.0)
        capacity = reference.requests_per_s
        rss_before = api.rss_bytes()
        outcome = await overload(load, capacity, factor=3.0, duration_s=4.0)
        rss_growth = api.rss_bytes() - rss_before
        # What the worker can do right after: a neighbour that takes a core for a while
        # lowers this as it lowered the overload's goodput, where the reference taken
        # before it would blame admission. A collapse under overload does not outlast it.
        after = await closed_loop(load, 2, 2.0)
    print(dataclasses.asdict(outcome), rss_growth)
    assert reference.statuses == {200: reference.ok}
    assert set(outcome.statuses) == {"200", "503"}, outcome
    assert not outcome.errors, outcome
    assert outcome.shed_with_retry_after == outcome.statuses["503"]
    # Admitted answers stay whole and in budget: admission let in only what the worker
    # could finish in time (a late one would have degraded). The worker's loop runs late by
    # about one request's pace on a saturated machine, and as clients see the answers the
    # generator's own lateness is in the figure too: the bounds add one pace inside the
    # service, two outside, as the fault tests do. (The figures, against the targets, are
    # the benchmark's: make bench-overload.)
    pace_ms = 2 * 1000.0 / capacity  # two connections, one request after the other
    # Without admission most answers at three times capacity would be late or degraded. With
    # it, none are on a quiet machine (make bench-overload: 0-0.1%), but some are on a
    # saturated 2-core one whose Redis, starved of CPU, reads past its 25 ms timeout five
    # times running and opens its breaker for half a second: about a tenth of the answers
    # each time. Loaded runs (the generator, the API, Triton, Redis and a busy neighbour on
    # 2 cores) measured 12% and 22% so; a breaker's openings are the machine's, not
    # admission's, so the bound leaves room for three of them and still catches a gate that
    # lets most requests in late (goodput, below, catches the collapse).
    assert (outcome.degraded_share or 0.0) <= 0.4, outcome
    assert outcome.admitted_server_p99_ms <= BUDGET_MS + MARGIN_MS + pace_ms, outcome
    assert outcome.admitted_p99_ms is not None
    assert outcome.admitted_p99_ms <= BUDGET_MS + MARGIN_MS + 2 * pace_ms, outcome
    # Refusals come at once, not after a wait: inside the service, a few milliseconds (a
    # request may wait in line for up to 10); as clients see them, much faster than an
    # answer, though the generator's own lateness on a busy machine is in the figure.
    assert outcome.shed_server_p99_ms <= 25.0, outcome
    assert outcome.shed_p50_ms is not None
    assert outcome.admitted_p50_ms is not None
    assert outcome.shed_p50_ms <= outcome.admitted_p50_ms / 2, outcome
    assert outcome.shed_p99_ms is not None
    assert outcome.shed_p99_ms <= BUDGET_MS, outcome
    # An unprotected service serves a fraction of its capacity at 3x (every request slow,
    # most timing out); this guards against that collapse.
    machine = min(capacity, after.requests_per_s)
    assert outcome.goodput_rps >= 0.5 * machine, (outcome, after.requests_per_s)
    assert rss_growth < 30 * 2**20, f"memory grew by {rss_growth} bytes under overload"


async def test_a_stall_far_below_capacity_sheds_nothing(stack: Stack, tmp_path: Path) -> None:
    with api_process(stack, tmp_path) as api:
        # The first request after readiness is answered: start-up's last steps are a stall
        # of their own, which must not read as overload.
        assert item_count_and_flags(api)[1] == []
        load = steady_load(api)
        traffic = asyncio.create_task(run(load, 20, 3.0))
        await asyncio.sleep(1.0)
        os.kill(api.pid, signal.SIGSTOP)  # the whole worker stands still: a long GC pause
        await asyncio.sleep(0.3)
        os.kill(api.pid, signal.SIGCONT)
        result = await traffic
    statuses = {r.status for r in result.records}
    assert statuses == {200}, [r for r in result.records if r.status != 200][:5]


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


async def _trickle(port: int, seconds: float) -> bytes:
    """A client that sends its headers, then one body byte every 0.2 s: the slow loris."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"user_id": "u1", "num_items": 10}'
    head = (
        "POST /recommend HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode())
    answer = b""
    try:
        for byte in body:
            writer.write(bytes([byte]))
            await writer.drain()
            try:
                answer = await asyncio.wait_for(reader.read(4096), 0.2)
            except TimeoutError:
                continue
            if answer:
                break
        if not answer:
            answer = await asyncio.wait_for(reader.read(4096), seconds)
    except (ConnectionError, TimeoutError):
        pass
    finally:
        writer.close()
    return answer


async def test_slow_senders_and_bad_bodies_take_nothing_from_others(
    stack: Stack, tmp_path: Path
) -> None:
    with api_process(stack, tmp_path) as api:
        loris = [asyncio.create_task(_trickle(api.port, 5.0)) for _ in range(8)]
        await asyncio.sleep(0.3)  # all eight are trickling
        async with httpx.AsyncClient(base_url=api.url, timeout=5.0) as client:
            huge = b'{"user_id": "u1", ' + b'"k": 1, ' * 130_000 + b'"num_items": 1}'
            many_keys = {"user_id": "u1", **{f"key{n}": n for n in range(8000)}}
            bad = [
                await client.post(
                    "/recommend", content=huge, headers={"content-type": "application/json"}
                ),
                await client.post("/recommend", json=many_keys),
            ]
            others = [
                await client.post("/recommend", json={"user_id": f"u{n}", "num_items": 10})
                for n in range(20)
            ]
        slow = await asyncio.gather(*loris)
    assert [response.status_code for response in bad] == [413, 422]
    assert len(bad[1].json()["fields"]) == 20
    assert [response.status_code for response in others] == [200] * 20
    # Each slow sender is answered 408 once its body is a second late, and let go.
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in slow), slow
