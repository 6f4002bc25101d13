"""The API as a process of its own (`recsys serve`), for benchmarks and fault tests.

Measuring the service in the process that also generates the load, or without its real
HTTP server, would measure something else; so it runs as production runs it, and is
stopped the way production stops it: SIGTERM, then a kill if it does not exit in time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from recsys_tools.demo import LocalStack, local_stack, stack_options
from recsys_tools.localstack import PortLease, start_on_ports


@dataclass
class ApiProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    lease: PortLease | None = None  # its port's, where start_api leased it: released by stop()

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
        give_up = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=2.0) as client:
            while time.monotonic() < give_up:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the API exited during start-up:\n{self.log_tail()}")
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
            if self.lease is not None and self.process.poll() is not None:
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
        yield api
    finally:
        api.stop()


def start_api(
    env: dict[str, str],
    log_path: Path,
    args: Sequence[str] = (),
    checkout: Path | None = None,
    ready_timeout_s: float = 60.0,
) -> ApiProcess:
    """`python -m app` with RECSYS_* settings from `env` and command-line `args`, on a
    leased port (on another where that one was taken); returns once it is ready.
    `checkout`: run the app of that tree instead (its root, as cwd)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")

    def start(ports: list[int]) -> ApiProcess:
        api = spawn_api(env, log_path, ports[0], args, checkout)
        try:
            api.wait_ready(ready_timeout_s)
        except BaseException:
            api.stop()
            raise
        return api

    api, (lease,) = start_on_ports("recsys-api", 1, start)
    api.lease = lease
    return api


def spawn_api(
    env: dict[str, str],
    log_path: Path,
    port: int,
    args: Sequence[str] = (),
    checkout: Path | None = None,
) -> ApiProcess:
    """The API spawned on `port`, not waited for (its log appended to)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "--log-level", "warning", *args],
            env={**os.environ, **env, "RECSYS_PORT": str(port)},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=checkout,
        )
    return ApiProcess(process, port, log_path)
