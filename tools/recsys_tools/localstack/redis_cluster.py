"""A throwaway Redis Cluster of a few masters on loopback TCP."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from recsys_tools.localstack.ports import LOOPBACK
from recsys_tools.localstack.processes import (
    Launch,
    ManagedProcess,
    start_managed_on_ports,
)
from recsys_tools.localstack.redis_server import find_redis_server, redis_answers

# A node's cluster bus listens this far above its port, on a port of its own to lease.
BUS_OFFSET = 10_000


def _start_node(server: str, workdir: Path, number: int) -> ManagedProcess:
    home = workdir / f"node-{number}"
    home.mkdir(parents=True, exist_ok=True)

    def launch(ports: Mapping[str, int]) -> Launch:
        port = ports["redis"]
        argv = (
            server,
            *("--port", str(port), "--bind", LOOPBACK, "--protected-mode", "yes"),
            *("--cluster-enabled", "yes", "--cluster-config-file", str(home / "nodes.conf")),
            *("--save", "", "--appendonly", "no", "--dir", str(home)),
        )
        return Launch(argv, dict(os.environ), partial(redis_answers, port), 10.0)

    return start_managed_on_ports(
        f"redis-cluster-{number}", ["redis"], launch, home / "redis.log", offsets=(0, BUS_OFFSET)
    )


def start_redis_cluster(workdir: Path, nodes: int = 3) -> tuple[list[ManagedProcess], str]:
    """A throwaway Redis Cluster of `nodes` masters on loopback TCP; returns one node's URL.

    A cluster cannot live on unix sockets (its nodes announce host:port to each other), so
    its nodes listen on 127.0.0.1 only, each on a leased port and its bus port. The slots are
    spread by `redis-cli --cluster create`.
    """
    server = find_redis_server()
    started: list[ManagedProcess] = []
    try:
        for number in range(nodes):
            started.append(_start_node(server, workdir, number))
        ports = [process.ports["redis"] for process in started]
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
