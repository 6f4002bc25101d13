"""Real redis-server and tritonserver processes for the demo and the tests.

Each is started in a session of its own and stopped by its pid (and that session's process
group, which holds Triton's Python-backend stubs), so nothing outlives its owner. Both listen
on loopback only: Redis on a unix socket, Triton's ports on 127.0.0.1. Every TCP port chosen
for a server here is leased (ports.py): drawn outside the kernel's ephemeral range and
held until the server stops, and a server whose port is taken anyway starts on another.

A ManagedProcess keeps how it was launched, so integration tests can inject the faults a
server has in production: frozen (SIGSTOP: sockets open, nothing answers), crashed (SIGKILL)
and restarted in place (same argv, port and socket, so clients reconnect to the same address).

The rooms: ports.py (leases), processes.py (process groups, readiness, faults),
redis_server.py, redis_cluster.py, triton_server.py, spark_cluster.py and the ingest and
archive processes. What the demo and the tests use is named here.
"""

from recsys_tools.localstack.archive_process import start_archive, unarchived
from recsys_tools.localstack.ingest_consumer import start_ingest, unapplied
from recsys_tools.localstack.ports import (
    LOOPBACK,
    PortLease,
    lease_ports,
    leased_port,
    start_on_ports,
)
from recsys_tools.localstack.processes import (
    Launch,
    ManagedProcess,
    ServerStartError,
    group_alive,
    project_root,
    start_managed_on_ports,
)
from recsys_tools.localstack.redis_cluster import start_redis_cluster
from recsys_tools.localstack.redis_server import find_redis_server, redis_answers, start_redis
from recsys_tools.localstack.triton_server import (
    TritonInstall,
    default_triton_env,
    find_triton,
    start_triton,
    triton_models_ready,
)

__all__ = [
    "LOOPBACK",
    "Launch",
    "ManagedProcess",
    "PortLease",
    "ServerStartError",
    "TritonInstall",
    "default_triton_env",
    "find_redis_server",
    "find_triton",
    "group_alive",
    "lease_ports",
    "leased_port",
    "project_root",
    "redis_answers",
    "start_archive",
    "start_ingest",
    "start_managed_on_ports",
    "start_on_ports",
    "start_redis",
    "start_redis_cluster",
    "start_triton",
    "triton_models_ready",
    "unapplied",
    "unarchived",
]
