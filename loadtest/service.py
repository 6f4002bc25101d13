"""The API as a process of its own (`recsys serve`), for benchmarks and fault tests.

Measuring the service in the process that also generates the load, or without its real
HTTP server, would measure something else; so it runs as production runs it, and is
stopped the way production stops it: SIGTERM, then a kill if it does not exit in time.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from recsys_tools.demo import LocalStack, local_stack, stack_options
from recsys_tools.localstack import PortLease, lease_ports
from recsys_tools.localstack.ports import ATTEMPTS, collided

log = logging.getLogger("loadtest")


class ApiExitedError(RuntimeError):
    """The API process ended before it was ready; the message ends with its log."""


@dataclass
class ApiProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    # Where the port was leased here: its lease (released by stop()) and how to start the
    # same API on another port, should something else have taken this one.
    lease: PortLease | None = None
    spawn: Callable[[int], subprocess.Popen[bytes]] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_bytes(self) -> int:
        """Resident memory of the process now (Linux)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Return once /readyz answers 200; on a port found taken (one leased here), start it
        again on another."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self._wait_ready(timeout_s)
                return
            except ApiExitedError as exc:
                if self.spawn is None or attempt == ATTEMPTS or not collided(exc, [self.port]):
                    raise
                self._move()

    def _move(self) -> None:
        """Start again on a newly leased port, this one's lease released."""
        assert self.spawn is not None
        if self.lease is not None:
            self.lease.release()
        (self.lease,) = lease_ports()
        log.warning(
            "the API found its port %d taken: starting it on %d", self.port, self.lease.port
        )
        self.port = self.lease.port
        self.process = self.spawn(self.port)

    def _wait_ready(self, timeout_s: float) -> None:
        give_up = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=2.0) as client:
            while time.monotonic() < give_up:
                if self.process.poll() is not None:
                    raise ApiExitedError(f"the API exited during start-up:\n{self.log_tail()}")
                try:
                    if client.get("/readyz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(f"the API was not ready in {timeout_s}s:\n{self.log_tail()}")

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, wait, then SIGKILL; the exit status (negative: killed by that signal)."""
        self.terminate()
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=5.0)
        finally:
            if self.lease is not None:
                self.lease.release()


@contextmanager
def local_service(world: Path, **settings: str) -> Iterator[tuple[ApiProcess, LocalStack]]:
    """The local stack on `world` (built if absent) and the API on it, ready; stopped after.

    `settings` are extra RECSYS_* settings for the API, by lower-case name.
    """
    options = stack_options(world)
    with (
        local_stack(options) as stack,
        api_on(stack, options.run_dir / "api.log", **settings) as api,
    ):
        yield api, stack


@contextmanager
def api_on(stack: LocalStack, log_path: Path, **settings: str) -> Iterator[ApiProcess]:
    """An API process on a running local stack, ready; stopped after."""
    env = {
        "RECSYS_REDIS_URL": stack.settings.redis_url,
        "RECSYS_TRITON_URL": stack.settings.triton_url,
        "RECSYS_ARTIFACTS_DIR": str(stack.settings.artifacts_dir),
        **{f"RECSYS_{name.upper()}": value for name, value in settings.items()},
    }
    api = start_api(env, log_path)
    try:
        api.wait_ready()
        yield api
    finally:
        api.stop()


def start_api(
    env: dict[str, str],
    log_path: Path,
    port: int | None = None,
    args: Sequence[str] = (),
    checkout: Path | None = None,
) -> ApiProcess:
    """`python -m app` with RECSYS_* settings from `env` and command-line `args`; returns
    once it is spawned, on `port` or else on a leased one. `checkout`: run the app of that
    tree instead (its root, as cwd)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def spawn(chosen: int) -> subprocess.Popen[bytes]:
        with log_path.open("wb") as log_file:
            return subprocess.Popen(
                [sys.executable, "-m", "app", "--log-level", "warning", *args],
                env={**os.environ, **env, "RECSYS_PORT": str(chosen)},
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=checkout,
            )

    if port is not None:
        return ApiProcess(spawn(port), port, log_path)
    (lease,) = lease_ports()
    try:
        process = spawn(lease.port)
    except BaseException:
        lease.release()
        raise
    return ApiProcess(process, lease.port, log_path, lease, spawn)
