"""Servers in process groups of their own: started, probed until ready, frozen, killed,
restarted in place and stopped by pid, so nothing outlives its owner."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.core.errors import RecsysError
from recsys_tools.localstack.ports import PortLease, start_on_ports

log = logging.getLogger("recsys.localstack")
STOP_GRACE_S = 10.0
KILL_WAIT_S = 5.0
# Bounds each readiness probe, so a frozen server reads as "not ready" instead of hanging.
PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class Launch:
    """How a server was started and how to tell it serves: enough to start it again in place."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    ready: Callable[[], bool]
    ready_timeout_s: float


@dataclass(slots=True)
class ManagedProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    launch: Launch | None = None
    # The TCP ports it listens on, by name, and their leases: held until stop(), so a
    # restart in place finds its ports as it left them.
    ports: Mapping[str, int] = field(default_factory=dict)
    leases: list[PortLease] = field(default_factory=list)

    @property
    def pid(self) -> int:
        """The server's pid, which is also its process group's id (it leads its own session)."""
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _signal(self, sig: signal.Signals) -> bool:
        """Send sig to the whole group; False when no member of it is left."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def freeze(self) -> None:
        """SIGSTOP the group: its sockets stay open and accept, but nothing answers (a hang)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the group after freeze()."""
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the group (frozen or not) and reap it: the crash case, no clean shutdown."""
        self._signal(signal.SIGKILL)
        self.process.wait()
        if not _reap_group(self.pid, KILL_WAIT_S):
            raise RuntimeError(f"{self.name} (group {self.pid}) survived SIGKILL")

    def restart(self) -> None:
        """Kill the server and start it again with the same argv, port and socket.

        Returns once it is ready again (Redis answers PING, Triton's models are ready).
        """
        if self.launch is None:
            raise RuntimeError(f"{self.name} was not started by this module; cannot restart")
        self.kill()
        self.process = popen(self.launch, self.log_path, append=True)
        self.await_ready(self.launch)

    def await_ready(self, launch: Launch) -> None:
        """Return once the server is ready; stop it if it never is, or the wait is interrupted.

        It runs in a session of its own, so a Ctrl-C meant for us never reaches it.
        """
        try:
            wait_for(self, launch.ready, launch.ready_timeout_s)
        except BaseException:
            self._halt()  # its ports stay leased: the owner stops it, or starts it again
            raise

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after a grace period;
        its ports are released once nothing of the group is left to hold them."""
        try:
            gone = self._halt()
        finally:
            if not group_alive(self.pid):
                for lease in self.leases:
                    lease.release()
        if not gone:
            log.warning(
                "%s (group %d) outlived SIGKILL: its ports stay leased", self.name, self.pid
            )

    def _halt(self) -> bool:
        """SIGTERM the group, then SIGKILL; whether none of it is left."""
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
            # A frozen process would hold the SIGTERM pending for ever: let it run first.
            self._signal(signal.SIGCONT)
            if not self._signal(sig):
                return True
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            if _reap_group(self.pid, wait_s):
                return True
        return not group_alive(self.pid)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group (the server or a child of it) still runs."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return _live_member(pgid)


def _live_member(pgid: int) -> bool:
    """Whether a member of the group is more than a zombie.

    A killed server's stubs are orphans that init reaps, and some inits take a second or two
    to do so; a zombie runs nothing and holds no port, so it does not count.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return True  # cannot tell zombies apart here: killpg found a member
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # exited while we looked
        # The command name (field 2) may hold spaces and ")": split after its last ")".
        state, _ppid, pgrp = text[text.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            return True
    return False


def _reap_group(pgid: int, wait_s: float) -> bool:
    """Wait for the group's other members (Triton's stubs) to exit too; True once none is left.

    They are not our children: their parent's death hands them to init, which reaps them.
    """
    give_up = time.monotonic() + wait_s
    while group_alive(pgid) and time.monotonic() < give_up:
        time.sleep(0.02)
    if group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        give_up = time.monotonic() + KILL_WAIT_S
        while group_alive(pgid) and time.monotonic() < give_up:
            time.sleep(0.02)
    return not group_alive(pgid)


def popen(launch: Launch, log_path: Path, append: bool = False) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # A restart appends, so the log still shows what the server said before it was killed.
    with log_path.open("ab" if append else "wb") as log_file:
        return subprocess.Popen(
            launch.argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(launch.env),
            start_new_session=True,
        )


class ServerStartError(RecsysError):
    """A local server exited or never became ready; the message ends with its log."""


def start_managed(
    name: str, launch: Launch, log_path: Path, append: bool = False
) -> ManagedProcess:
    """Spawn the server and return once launch.ready() holds (stopping it if it never does)."""
    managed = ManagedProcess(name, popen(launch, log_path, append), log_path, launch)
    managed.await_ready(launch)
    return managed


def start_managed_on_ports(
    name: str,
    port_names: Sequence[str],
    launch_for: Callable[[Mapping[str, int]], Launch],
    log_path: Path,
    *,
    offsets: Sequence[int] = (0,),
) -> ManagedProcess:
    """The server on leased ports, one per name in `port_names` (with `offsets`, a group per
    name: its port and the ports at those offsets from it, 0 among them); started again on
    others while one was taken. The ports stay leased until the server is stopped."""

    def start(ports: list[int]) -> ManagedProcess:
        named = dict(zip(port_names, ports[:: len(offsets)], strict=True))
        # Appended: the log shows why a try on other ports was needed.
        managed = start_managed(name, launch_for(named), log_path, append=True)
        managed.ports = named
        return managed

    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")

    managed, leases = start_on_ports(name, len(port_names), start, offsets=offsets)
    managed.leases = leases
    return managed


def start_logging_module(
    name: str,
    module: str,
    ready_line: str,
    env: Mapping[str, str],
    log_path: Path,
    niceness: int,
    *,
    metrics_setting: str,
    metrics: bool = False,
) -> ManagedProcess:
    """`python -m module` at `niceness` with `env`; returns once its log says `ready_line`.

    `metrics_setting` names the variable of its metrics port: 0 (none served), or with
    `metrics` a leased port, its `ports["metrics"]`.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def ready() -> bool:
        try:
            return ready_line in log_path.read_text(errors="replace")
        except OSError:
            return False

    def launch(ports: Mapping[str, int]) -> Launch:
        argv = ("nice", "-n", str(niceness), sys.executable, "-m", module)
        full = {**env, metrics_setting: str(ports.get("metrics", 0))}
        return Launch(argv, full, ready, ready_timeout_s=60.0)

    return start_managed_on_ports(name, ["metrics"] if metrics else [], launch, log_path)


def wait_for(managed: ManagedProcess, ready: Callable[[], bool], timeout_s: float) -> None:
    with _interrupts_noted() as interrupted:
        give_up = time.monotonic() + timeout_s
        while not ready():
            if interrupted:
                raise KeyboardInterrupt
            if not managed.running():
                raise ServerStartError(
                    f"{managed.name} exited while starting (its log: {managed.log_path}); the "
                    f"end of that log says why:\n{managed.log_tail()}"
                )
            if time.monotonic() > give_up:
                raise ServerStartError(
                    f"{managed.name} was not ready in {timeout_s} s (its log: {managed.log_path}):"
                    f"\n{managed.log_tail()}"
                )
            time.sleep(0.05)
        if interrupted:
            raise KeyboardInterrupt


@contextlib.contextmanager
def _interrupts_noted() -> Iterator[list[int]]:
    """Note SIGINT instead of raising it where it lands, and let the caller raise it.

    A KeyboardInterrupt raised inside a blocking gRPC call (the Triton readiness probe)
    comes out as a cancelled call, which a probe reads as "not ready yet": the Ctrl-C
    would be lost. Noted here, it is raised between probes.
    """
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def project_root() -> Path:
    """The checkout holding this package (for the default .venv-triton and model_repository)."""
    return Path(__file__).resolve().parents[3]
