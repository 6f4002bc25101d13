"""A throwaway Redis Cluster of a few masters on loopback TCP."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from functools import partial
from pathlib import Path

from recsys_tools.localstack.processes import LOOPBACK, Launch, ManagedProcess, start_managed
from recsys_tools.localstack.redis_server import find_redis_server, redis_answers


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _cluster_port() -> int:
    """A free port whose cluster bus port (10,000 above it, so at most 65535) is free too."""
    for _ in range(100):
        port = random.randint(20_000, 55_000)
        if _port_free(port) and _port_free(port + 10_000):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def start_redis_cluster(workdir: Path, nodes: int = 3) -> tuple[list[ManagedProcess], str]:
    """A throwaway Redis Cluster of `nodes` masters on loopback TCP; returns one node's URL.

    A cluster cannot live on unix sockets (its nodes announce host:port to each other), so
    its nodes listen on 127.0.0.1 only. The slots are spread by `redis-cli --cluster create`.
    """
    server = find_redis_server()
    ports = [_cluster_port() for _ in range(nodes)]
    started: list[ManagedProcess] = []
    try:
        for port in ports:
            home = workdir / str(port)
            home.mkdir(parents=True, exist_ok=True)
            argv = (
                server,
                *("--port", str(port), "--bind", LOOPBACK, "--protected-mode", "yes"),
                *("--cluster-enabled", "yes", "--cluster-config-file", str(home / "nodes.conf")),
                *("--save", "", "--appendonly", "no", "--dir", str(home)),
            )
            launch = Launch(argv, dict(os.environ), partial(redis_answers, port), 10.0)
            started.append(start_managed(f"redis-cluster-{port}", launch, home / "redis.log"))
        cli = str(Path(server).with_name("redis-cli"))
        subprocess.run(
            [
                *(cli, "--cluster", "create"),
                *(f"{LOOPBACK}:{port}" for port in ports),
                *("--cluster-replicas", "0", "--cluster-yes"),
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        _wait_cluster_ok(cli, ports)
    except BaseException:
        for process in started:
            process.stop()
        raise
    return started, f"redis://{LOOPBACK}:{ports[0]}/0"


def _wait_cluster_ok(cli: str, ports: list[int], timeout_s: float = 20.0) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        states = [
            subprocess.run(
                [cli, "-p", str(port), "cluster", "info"], capture_output=True, text=True
            ).stdout
            for port in ports
        ]
        if all("cluster_state:ok" in state for state in states):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the Redis Cluster on {ports} never reached cluster_state:ok")


# Triton --------------------------------------------------------------------------------------
