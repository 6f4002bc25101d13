"""Ports that nothing takes by chance, on real servers.

Another process takes every port of the kernel's ephemeral range it can get (as outgoing
connections and other servers' binds to port 0 do on a busy host): a port chosen the old way
(the kernel's choice, released, bound a moment later) is lost to it, while Triton, a Redis
Cluster and the API all start on leased ports. And a server whose leased port a process
outside the project has bound anyway starts on another: both ways a start can go again, the
managed servers' (Triton, as Redis, Prometheus and the consumers) and the API process's.
"""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

import httpx
import pytest
import redis
from recsys_tools.localstack import (
    LOOPBACK,
    ManagedProcess,
    PortLease,
    default_triton_env,
    start_redis_cluster,
    start_triton,
    triton_models_ready,
)
from recsys_tools.localstack import ports as ports_module
from recsys_tools.localstack.ports import ephemeral_range, port_in_use

from loadtest import service
from loadtest.service import ApiProcess, start_api
from tests.integration.conftest import Stack

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
    started: list[subprocess.Popen[str]] = []
    try:
        while remaining > 0:
            share = min(remaining, 8_000)  # each process within a modest limit of open files
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


def _outside_ephemeral(ports: Sequence[int]) -> list[int]:
    low, high = ephemeral_range()
    return [port for port in ports if not low <= port <= high]


@pytest.fixture
def api_env(stack: Stack) -> dict[str, str]:
    return {
        "RECSYS_REDIS_URL": stack.redis_url,
        "RECSYS_TRITON_URL": stack.triton_url,
        "RECSYS_ARTIFACTS_DIR": str(stack.world),
    }


def _ready(api: ApiProcess) -> ApiProcess:
    try:
        api.wait_ready()
    except BaseException:
        api.stop()
        raise
    return api


def test_servers_start_on_leased_ports_while_the_ephemeral_range_is_taken(
    hog: None, stack: Stack, api_env: dict[str, str], tmp_path: Path
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
    api = None
    try:
        triton, triton_url = start_triton(
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
        api = _ready(start_api({**api_env, "RECSYS_TRITON_URL": triton_url}, tmp_path / "a.log"))

        ports = [port for process in started for port in process.ports.values()] + [api.port]
        assert _outside_ephemeral(ports) == ports
        assert triton_models_ready(triton_url, [stack.schema.model_name])
        assert redis.RedisCluster.from_url(cluster_url).ping()
        assert httpx.get(f"{api.url}/readyz").is_success
    finally:
        if api is not None:
            api.stop()
        for process in reversed(started):
            process.stop()


@pytest.fixture
def squatted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[socket.socket]]:
    """The first port leased is bound at once by a socket of this test: what a process
    outside the project that binds a port between its lease and the server's bind does."""
    held: list[socket.socket] = []
    lease = ports_module.lease_ports

    def squat_first(count: int = 1, *, offsets: Sequence[int] = (0,)) -> list[PortLease]:
        leases = lease(count, offsets=offsets)
        if not held:
            squatter = socket.socket()
            squatter.bind((LOOPBACK, leases[0].port))
            squatter.listen()
            held.append(squatter)
        return leases

    monkeypatch.setattr(ports_module, "lease_ports", squat_first)
    monkeypatch.setattr(service, "lease_ports", squat_first)
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


def _taken(squatted: list[socket.socket]) -> int:
    (squatter,) = squatted
    port: int = squatter.getsockname()[1]
    return port


def test_triton_whose_port_was_taken_starts_on_another(
    squatted: list[socket.socket], stack: Stack, tmp_path: Path
) -> None:
    process, url = start_triton(
        default_triton_env(), stack.model_repository, tmp_path, [stack.schema.model_name]
    )
    try:
        taken = _taken(squatted)
        assert process.ports["grpc"] != taken
        assert triton_models_ready(url, [stack.schema.model_name])
    finally:
        process.stop()


def test_the_api_whose_port_was_taken_starts_on_another(
    squatted: list[socket.socket], api_env: dict[str, str], tmp_path: Path
) -> None:
    api = _ready(start_api(api_env, tmp_path / "api.log"))
    try:
        taken = _taken(squatted)
        assert api.port != taken
        assert httpx.get(f"{api.url}/readyz").is_success
    finally:
        assert api.stop() == 0, api.log_tail()
