"""The fault tools of recsys_tools.localstack on real servers: freeze, resume, kill, restart, stop.

Every server here is this module's own; the session stack's are never touched.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.grpc as triton_grpc
from recsys_tools.localstack import (
    ManagedProcess,
    default_triton_env,
    group_alive,
    start_triton,
)
from recsys_tools.localstack.ports import ephemeral_range
from redis.backoff import NoBackoff
from redis.retry import Retry
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration
MODEL = "ranking_model"
FROZEN_TIMEOUT_S = 0.2


def _redis_client(url: str) -> redis.Redis:
    # No retries: a PING that times out must fail after one socket timeout, not after several.
    return redis.Redis.from_url(url, socket_timeout=FROZEN_TIMEOUT_S, retry=Retry(NoBackoff(), 0))


def test_frozen_redis_does_not_answer_until_resumed(
    bare_redis: tuple[ManagedProcess, str],
) -> None:
    process, url = bare_redis
    client = _redis_client(url)
    try:
        assert client.ping()
        assert client.config_get("port") == {"port": "0"}  # unix socket only, never TCP
        process.freeze()
        try:
            with pytest.raises(redis.TimeoutError):
                client.ping()
        finally:
            process.resume()
        assert client.ping()
    finally:
        client.close()


def test_redis_restarts_on_the_same_socket(bare_redis: tuple[ManagedProcess, str]) -> None:
    process, url = bare_redis
    client = _redis_client(url)
    try:
        client.set("written-before", "1")
        old_pid = process.pid
        process.kill()
        assert not group_alive(old_pid)
        with pytest.raises(redis.ConnectionError):
            client.ping()
        process.restart()
        assert process.pid != old_pid
        assert client.ping()  # the same URL: the socket path did not move
        assert client.get("written-before") is None  # no persistence: a crash loses the data
    finally:
        client.close()


def _listening_addresses(port: int) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The local addresses with a TCP socket listening on port, from /proc/net/tcp{,6}."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word of the address in host (little-endian) order.
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(ipaddress.ip_address(words))
    return found


def _is_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


@pytest.fixture(scope="module")
def own_triton(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """A Triton of this module's own on the stack's model repository, every port enabled."""
    workdir = tmp_path_factory.mktemp("own-triton")
    process, _ = start_triton(
        default_triton_env(), stack.model_repository, workdir, [MODEL], http=True, metrics=True
    )
    try:
        yield process
    finally:
        process.stop()


def _scores(url: str) -> np.ndarray:
    client = triton_grpc.InferenceServerClient(url)
    try:
        features = triton_grpc.InferInput("features", [4, 121], "FP32")
        features.set_data_from_numpy(np.zeros((4, 121), dtype=np.float32))
        scores: np.ndarray = client.infer(MODEL, [features], client_timeout=5.0).as_numpy("score")
        return scores
    finally:
        client.close()


def _wait_for_listener(port: int) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    # Readiness is gRPC's; Triton opens its HTTP and metrics ports a moment later.
    give_up = time.monotonic() + 5.0
    while not (addresses := _listening_addresses(port)) and time.monotonic() < give_up:
        time.sleep(0.05)
    return addresses


def test_triton_listens_on_loopback_only_on_leased_ports(own_triton: ManagedProcess) -> None:
    assert set(own_triton.ports) == {"grpc", "http", "metrics"}
    low, high = ephemeral_range()  # where ports the kernel hands out can be taken by chance
    assert not [port for port in own_triton.ports.values() if low <= port <= high]
    for port in own_triton.ports.values():
        addresses = _wait_for_listener(port)
        assert addresses, f"nothing listens on {port}"
        assert all(_is_loopback(a) for a in addresses), addresses


def test_triton_refuses_model_control_by_default(own_triton: ManagedProcess) -> None:
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{own_triton.ports['grpc']}")
    try:
        with pytest.raises(InferenceServerException, match="explicit model load / unload"):
            client.unload_model(MODEL)
        assert client.is_model_ready(MODEL)
    finally:
        client.close()


def test_triton_restarts_on_the_same_port(own_triton: ManagedProcess) -> None:
    process = own_triton
    url = f"127.0.0.1:{process.ports['grpc']}"
    before = _scores(url)
    old_pid = process.pid
    process.restart()
    assert not group_alive(old_pid)  # neither the old server nor its backend stubs
    assert process.pid != old_pid
    np.testing.assert_array_equal(_scores(url), before)


def test_stopping_a_frozen_triton_leaves_nothing_running(own_triton: ManagedProcess) -> None:
    process = own_triton
    pgid = process.pid
    process.freeze()
    process.stop()
    assert not process.running()
    assert not group_alive(pgid)
