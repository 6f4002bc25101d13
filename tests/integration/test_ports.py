"""Ports that nothing takes by chance, on real servers.

Another process takes every port of the kernel's ephemeral range it can get (as outgoing
connections and other servers' binds to port 0 do on a busy host): a port chosen the old way
(the kernel's choice, released, bound a moment later) is lost to it, while Triton and a
Redis Cluster start on leased ports. And Triton, whose leased port a process outside the
project has bound anyway, starts on another.
"""

from __future__ import annotations

import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

import pytest
import redis
from recsys_tools.localstack import (
    LOOPBACK,
    ManagedProcess,
    default_triton_env,
    start_redis_cluster,
    start_triton,
)
from recsys_tools.localstack.ports import ephemeral_range, port_in_use

from tests.integration.conftest import Stack
from tests.squat import squatted_port, squatting_first_lease

pytestmark = pytest.mark.integration

HOG = Path(__file__).with_name("port_hog.py")
# The share of the kernel's odd ports (those it gives binds to port 0 first) the hog holds:
# nearly all, so that one released is bound again by it within milliseconds.
HOG_SHARE = 0.92
KERNEL_TRIES = 5


def _wait_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], timeout_s)
    return process.stdout.readline() if readable else ""


@pytest.fixture
def hog() -> Iterator[None]:
    """Processes holding nearly every odd port of the ephemeral range, churning them."""
    low, high = ephemeral_range()
    remaining = int((high - low + 1) // 2 * HOG_SHARE)
    _, files = resource.getrlimit(resource.RLIMIT_NOFILE)
    per_process = max(256, min(8_000, files - 256))
    started: list[subprocess.Popen[str]] = []
    try:
        while remaining > 0:
            share = min(remaining, per_process)
            process = subprocess.Popen(
                [sys.executable, str(HOG), str(share)], stdout=subprocess.PIPE, text=True
            )
            started.append(process)
            line = _wait_line(process, 60.0)
            assert line.startswith("holding"), f"the port hog said {line!r}"
            remaining -= share
        yield
    finally:
        for process in started:
            process.kill()
            process.wait()


def _until(condition: Callable[[], bool], timeout_s: float) -> bool:
    give_up = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.01)
    return True


def outside_ephemeral(ports: Sequence[int]) -> bool:
    low, high = ephemeral_range()
    return not [port for port in ports if low <= port <= high]


def test_servers_start_on_leased_ports_while_the_ephemeral_range_is_taken(
    hog: None, stack: Stack, tmp_path: Path
) -> None:
    # The race is there: a port the kernel chose, released, is soon another's.
    lost = 0
    for _ in range(KERNEL_TRIES):
        with socket.socket() as probe:
            probe.bind((LOOPBACK, 0))
            chosen = probe.getsockname()[1]
        lost += _until(partial(port_in_use, chosen), 5.0)
    print(f"{lost} of {KERNEL_TRIES} ports chosen by the kernel were taken before a bind")
    assert lost > 0

    started: list[ManagedProcess] = []
    try:
        triton, _ = start_triton(
            default_triton_env(),
            stack.model_repository,
            tmp_path / "triton",
            [stack.schema.model_name],
            http=True,
            metrics=True,
        )
        started.append(triton)
        nodes, cluster_url = start_redis_cluster(tmp_path / "cluster")
        started += nodes
        assert outside_ephemeral([port for p in started for port in p.ports.values()])
        assert redis.RedisCluster.from_url(cluster_url).ping()
    finally:
        for process in reversed(started):
            process.stop()


def test_triton_whose_port_was_taken_starts_on_another(
    monkeypatch: pytest.MonkeyPatch, stack: Stack, tmp_path: Path
) -> None:
    with squatting_first_lease(monkeypatch) as squatter:
        process, _ = start_triton(
            default_triton_env(), stack.model_repository, tmp_path, [stack.schema.model_name]
        )
        try:
            assert squatter, "Triton drew no lease"
            assert process.ports["grpc"] != squatted_port(squatter)
            assert "already in use" in process.log_path.read_text()  # its first try said so
        finally:
            process.stop()
