"""Leased ports: drawn outside the kernel's ephemeral range, held across processes, and a
start whose port was taken made again on others (recsys_tools.localstack.ports)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from recsys_tools.localstack import Launch, ports, start_managed_on_ports
from recsys_tools.localstack.ports import (
    LOOPBACK,
    candidate_ports,
    collided,
    ephemeral_range,
    lease_ports,
    port_in_use,
    reserved_ports,
    start_on_ports,
)

from tests.squat import squatted_port, squatting_first_lease

# Tries to lock the port's file as another process would: prints "held" or "free".
OTHER_PROCESS = """
import fcntl, os, sys
fd = os.open(os.path.join(sys.argv[1], sys.argv[2]), os.O_RDWR | os.O_CREAT, 0o666)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except BlockingIOError:
    print("held")
"""


@pytest.fixture(autouse=True)
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "locks"
    monkeypatch.setenv("RECSYS_PORT_LOCKS", str(folder))
    return folder


def _seen_by_another_process(locks: Path, port: int) -> str:
    done = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS, str(locks), str(port)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_candidates_lie_outside_the_ephemeral_range_and_the_reserved_ports() -> None:
    candidates = candidate_ports((32768, 60999), {20000, 20001})
    assert candidates[0] == ports.LOWEST
    assert candidates[-1] == ports.HIGHEST
    assert not [p for p in candidates if 32768 <= p <= 60999]
    assert 20000 not in candidates
    assert 20001 not in candidates
    assert 32767 in candidates
    assert 61000 in candidates


def test_a_range_that_leaves_too_few_ports_is_drawn_from_whole() -> None:
    candidates = candidate_ports((1024, 65000), set())
    assert len(candidates) == ports.HIGHEST - ports.LOWEST + 1


def test_the_kernel_settings_are_read(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("40000\t50000\n")
    (tmp_path / "reserved").write_text("8080,9000-9002\n")
    assert ephemeral_range(tmp_path / "range") == (40000, 50000)
    assert reserved_ports(tmp_path / "reserved") == {8080, 9000, 9001, 9002}
    assert ephemeral_range(tmp_path / "absent") == ports.DEFAULT_EPHEMERAL
    (tmp_path / "empty").write_text("\n")
    assert reserved_ports(tmp_path / "empty") == set()


def test_leased_ports_are_outside_the_range_and_distinct() -> None:
    leases = lease_ports(20)
    try:
        drawn = [lease.port for lease in leases]
        low, high = ephemeral_range()
        assert len(set(drawn)) == 20
        assert not [p for p in drawn if low <= p <= high]
    finally:
        for lease in leases:
            lease.release()


def test_a_lease_holds_its_port_against_other_processes_until_released(locks: Path) -> None:
    (lease,) = lease_ports()
    assert _seen_by_another_process(locks, lease.port) == "held"
    lease.release()
    lease.release()  # twice is harmless
    assert _seen_by_another_process(locks, lease.port) == "free"


def test_a_held_port_and_a_bound_port_are_never_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as bound:
        bound.bind((LOOPBACK, 0))
        taken = bound.getsockname()[1]
        (held,) = lease_ports()
        free = next(p for p in range(20_000, 30_000) if p != held.port and not port_in_use(p))
        monkeypatch.setattr(ports, "candidate_ports", lambda: [taken, held.port, free])
        try:
            drawn = lease_ports(1)
            assert [lease.port for lease in drawn] == [free]
            drawn[0].release()
        finally:
            held.release()


def test_no_free_port_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    (held,) = lease_ports()
    monkeypatch.setattr(ports, "candidate_ports", lambda: [held.port])
    monkeypatch.setattr(ports, "DRAWS", 20)
    try:
        with pytest.raises(RuntimeError, match="no free port"):
            lease_ports()
    finally:
        held.release()


def test_a_group_leases_each_port_at_its_offset() -> None:
    leases = lease_ports(2, offsets=(0, 10_000))
    try:
        drawn = [lease.port for lease in leases]
        assert drawn[1] == drawn[0] + 10_000
        assert drawn[3] == drawn[2] + 10_000
    finally:
        for lease in leases:
            lease.release()


def test_a_refusal_is_a_collision_when_a_line_names_the_port_or_the_port_is_held() -> None:
    with socket.socket() as bound:
        bound.bind((LOOPBACK, 0))
        held = bound.getsockname()[1]
        assert collided(RuntimeError("x"), [held])
    said = "started\nlisten tcp 127.0.0.1:23456: bind: address already in use\nbye"
    assert collided(RuntimeError(said), [23456])
    assert collided(RuntimeError("port 23456 on 127.0.0.1 is in use: stop what holds it"), [23456])
    # In use, but not one of its ports: another fault, not tried again on others.
    assert not collided(RuntimeError(said), [23457])
    assert not collided(RuntimeError("too many common timeouts already in use"), [23457])
    assert not collided(RuntimeError("the model failed to load"), [23457])


class _Server:
    """A listening socket on a port, as a server's start would make it."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        try:
            self.sock.bind((LOOPBACK, port))
        except OSError:
            self.sock.close()
            raise
        self.sock.listen()
        self.port = port


def test_a_start_whose_port_was_taken_goes_again_on_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tries: list[list[int]] = []

    def start(chosen: list[int]) -> list[_Server]:
        tries.append(chosen)
        servers: list[_Server] = []
        try:
            for port in chosen:
                servers.append(_Server(port))
        except OSError:
            for server in servers:
                server.sock.close()
            raise
        return servers

    with squatting_first_lease(monkeypatch) as squatter:
        servers, leases = start_on_ports("toy", 1, start, offsets=(0, 1))
        assert len(tries) == 2
        assert squatted_port(squatter) == tries[0][1]  # the group's last port
        assert [s.port for s in servers] == [lease.port for lease in leases] == tries[1]
        assert not set(tries[0]) & set(tries[1])
        for server in servers:
            server.sock.close()
        for held in leases:
            held.release()


# A server that says what a real one says when its port is taken, then exits.
TOY_SERVER = """
import socket, sys, time
sock = socket.socket()
try:
    sock.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as exc:
    print(f"bind 127.0.0.1:{sys.argv[1]}: {exc}", flush=True)
    sys.exit(1)
sock.listen()
print("listening", flush=True)
time.sleep(600)
"""


def test_a_managed_server_moves_off_a_taken_port_and_releases_its_own_when_stopped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, locks: Path
) -> None:
    log_path = tmp_path / "toy.log"

    def launch(named: Mapping[str, int]) -> Launch:
        argv = (sys.executable, "-c", TOY_SERVER, str(named["toy"]))
        ready = lambda: "listening" in log_path.read_text()  # noqa: E731
        return Launch(argv, dict(os.environ), ready, ready_timeout_s=30.0)

    with squatting_first_lease(monkeypatch) as squatter:
        server = start_managed_on_ports("toy", ["toy"], launch, log_path)
        try:
            taken = squatted_port(squatter)
            assert server.ports["toy"] != taken
            assert f"bind 127.0.0.1:{taken}: [Errno 98] Address already in use" in (
                log_path.read_text()
            )
            assert _seen_by_another_process(locks, server.ports["toy"]) == "held"
            assert _seen_by_another_process(locks, taken) == "free"
        finally:
            server.stop()
    assert _seen_by_another_process(locks, server.ports["toy"]) == "free"


def test_a_start_that_fails_otherwise_is_not_tried_again() -> None:
    tries: list[list[int]] = []

    def start(chosen: list[int]) -> None:
        tries.append(chosen)
        raise RuntimeError("the model failed to load")

    with pytest.raises(RuntimeError, match="model failed"):
        start_on_ports("toy", 2, start)
    assert len(tries) == 1


def test_a_port_taken_every_time_gives_up_after_the_attempts() -> None:
    tries: list[list[int]] = []

    def start(chosen: list[int]) -> None:
        tries.append(chosen)
        raise RuntimeError(f"bind 127.0.0.1:{chosen[0]}: Address already in use")

    with pytest.raises(RuntimeError, match="already in use"):
        start_on_ports("toy", 1, start, attempts=3)
    assert len(tries) == 3


def test_a_lock_folder_that_is_a_link_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "recsys-ports"
    link.symlink_to(elsewhere)
    monkeypatch.setenv("RECSYS_PORT_LOCKS", str(link))
    (lease,) = lease_ports()
    try:
        assert not list(elsewhere.iterdir())
        assert (tmp_path / f"recsys-ports-{os.getuid()}" / str(lease.port)).is_file()
    finally:
        lease.release()
