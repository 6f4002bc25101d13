"""Every expected failure of the command line: one line naming cause and fix, a non-zero exit.

Each runs the real entry point in its own process, as an operator would, and reads what it
printed: no traceback, the cause named, and nothing left running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from recsys_tools.localstack import lease_ports, leased_port
from recsys_tools.world.recipes.demo import DemoSize, build_demo_world

from app.world.schema import load_schema
from tests.recsys_cli import RECSYS

TINY = DemoSize(items=400, users=60, impressions=4000)
SERVE = [sys.executable, "-m", "app"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "world"
    build_demo_world(path, load_schema(), TINY, seed=5)
    return path


def _env(**settings: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RECSYS_")}
    return {**clean, **{f"RECSYS_{k.upper()}": v for k, v in settings.items()}}


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run(
        argv, env=env or _env(), capture_output=True, text=True, timeout=120, check=False
    )
    return done.returncode, done.stdout + done.stderr


def _assert_one_plain_line(output: str, *expected: str) -> None:
    assert "Traceback" not in output, output
    assert "never retrieved" not in output, output
    lines = [line for line in output.splitlines() if all(word in line for word in expected)]
    assert len(lines) == 1, output


@pytest.fixture
def unused_port() -> Iterator[int]:
    """A port nothing listens on, none of the project's servers may take, while the test runs."""
    with leased_port() as port:
        yield port


def test_load_redis_with_an_unreachable_url(world: Path, unused_port: int) -> None:
    url = f"redis://127.0.0.1:{unused_port}/0"
    code, output = _run([*RECSYS, "load-redis", "--world", str(world), "--redis-url", url])
    assert code == 2
    _assert_one_plain_line(output, "cannot reach Redis", "--redis-url")


def test_load_redis_with_a_malformed_url(world: Path) -> None:
    code, output = _run([*RECSYS, "load-redis", "--world", str(world), "--redis-url", "nowhere"])
    assert code == 2
    _assert_one_plain_line(output, "--redis-url", "nowhere")


@pytest.mark.parametrize("argv", [SERVE, [*RECSYS, "serve"]])
def test_a_bad_setting_names_its_variable(argv: list[str]) -> None:
    code, output = _run(argv, _env(port="99999"))
    assert code == 2
    _assert_one_plain_line(output, "RECSYS_PORT", "65535")


def test_a_busy_port_is_refused_before_anything_loads(world: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, output = _run(SERVE, _env(port=str(port), artifacts_dir=str(world)))
    assert code == 2
    _assert_one_plain_line(output, f"port {port}", "in use", "RECSYS_PORT")
    assert "items with model" not in output


@pytest.fixture
def serve_port() -> Iterator[int]:
    """The API's own port, leased: the start-up check probes it before anything loads, so
    the default (8080) would answer for whatever else the machine serves there."""
    with leased_port() as port:
        yield port


def test_a_missing_world(tmp_path: Path, serve_port: int) -> None:
    code, output = _run(SERVE, _env(artifacts_dir=str(tmp_path / "absent"), port=str(serve_port)))
    assert code != 0
    _assert_one_plain_line(output, "is missing", "recsys build-world")


def test_serve_without_redis(world: Path, unused_port: int, serve_port: int) -> None:
    env = _env(
        artifacts_dir=str(world),
        redis_url=f"redis://127.0.0.1:{unused_port}/0",
        startup_timeout_s="1",
        port=str(serve_port),
    )
    code, output = _run(SERVE, env)
    assert code != 0
    _assert_one_plain_line(output, "start-up refused", "cannot reach Redis", "RECSYS_REDIS_URL")


@pytest.fixture
def serve_waiting_for_redis(world: Path) -> Iterator[subprocess.Popen[str]]:
    leases = lease_ports(2)
    env = _env(
        artifacts_dir=str(world),
        redis_url=f"redis://127.0.0.1:{leases[0].port}/0",
        startup_timeout_s="60",
        port=str(leases[1].port),
    )
    process = subprocess.Popen(
        SERVE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for lease in leases:
            lease.release()


def _wait_for_line(process: subprocess.Popen[str], text: str, timeout_s: float) -> str:
    assert process.stdout is not None
    seen = ""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        line = process.stdout.readline()
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"no {text!r} within {timeout_s} s:\n{seen}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_one_signal_stops_a_start_up_that_waits(
    serve_waiting_for_redis: subprocess.Popen[str], sig: signal.Signals
) -> None:
    process = serve_waiting_for_redis
    _wait_for_line(process, "waiting for redis", timeout_s=30)
    process.send_signal(sig)
    started = time.monotonic()
    output, _ = process.communicate(timeout=10)
    assert time.monotonic() - started < 5
    assert process.returncode != 0
    _assert_one_plain_line(output, "start-up interrupted")


def test_build_world_with_a_wrong_column(tmp_path: Path) -> None:
    log = tmp_path / "ratings.csv"
    log.write_text("userId,movieId,rating,timestamp\n1,10,4.0,1000\n")
    code, output = _run(
        [*RECSYS, "build-world", "--interactions", str(log), "--world", str(tmp_path / "w")]
    )
    assert code == 2
    _assert_one_plain_line(output, "user_id", "--user-col")


def test_the_demo_never_overwrites_a_world_it_did_not_build(
    tmp_path: Path, unused_port: int
) -> None:
    world = tmp_path / "mine"
    world.mkdir()
    (world / "items.npz").write_bytes(b"not the demo's")
    code, output = _run([*RECSYS, "demo", "--world", str(world), "--port", str(unused_port)])
    assert code == 2
    _assert_one_plain_line(output, "not a complete world", "left alone")
    assert sorted(p.name for p in world.iterdir()) == ["items.npz"]
    assert (world / "items.npz").read_bytes() == b"not the demo's"


def test_every_command_prints_its_help() -> None:
    """argparse formats help text with %: one stray percent sign breaks `recsys --help`."""
    import argparse

    from recsys_tools.cli import _parser

    parser = _parser()
    assert "build-world" in parser.format_help()
    pending = [parser]
    while pending:
        current = pending.pop()
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    assert sub.format_help(), sub.prog
                    pending.append(sub)
