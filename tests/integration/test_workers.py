"""Several workers on one port: one set of metrics between them, one clean stop."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from recsys_tools.localstack import ManagedProcess, leased_port

from app.process.workers import METRICS_DIR_ENV
from loadtest.service import ApiProcess, spawn_api
from tests.integration.conftest import PLAIN_RULES, Stack, metric_samples
from tests.integration.test_faults import api_process

pytestmark = pytest.mark.integration

WORKERS = 2
REQUESTS = 40


@contextmanager
def workers_api(stack: Stack, workdir: Path) -> Iterator[ApiProcess]:
    with api_process(stack, workdir, workers=str(WORKERS), index_mmap="true") as api:
        yield api


def _children(pid: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue
        if fields.get("PPid", "").strip() == str(pid):
            found.append(int(status.parent.name))
    return found


def _metrics_dir(workers: list[int]) -> Path:
    for pid in workers:
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            name, _, value = entry.partition(b"=")
            if name.decode() == METRICS_DIR_ENV:
                return Path(value.decode())
    raise AssertionError("no worker names a metrics directory")


def _scrape(url: str) -> dict[str, float]:
    # A new connection per scrape, so the scrapes land on different workers.
    return metric_samples(httpx.get(f"{url}/metrics", timeout=5.0).text)


def _until(check: object, timeout_s: float = 30.0) -> None:
    give_up = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > give_up:
            raise AssertionError("timed out")
        time.sleep(0.2)


def test_every_scrape_reports_the_sum_over_the_workers(stack: Stack, tmp_path: Path) -> None:
    with workers_api(stack, tmp_path) as api:
        _until(lambda: _scrape(api.url).get("recsys_workers{}") == WORKERS)
        ok = "recsys_requests_total{outcome=ok}"
        before = _scrape(api.url).get(ok, 0.0)
        for n in range(REQUESTS):
            body = {"user_id": f"u{n}", "num_items": 5}
            answer = httpx.post(f"{api.url}/recommend", json=body, timeout=5.0)
            assert answer.status_code == 200, answer.text
        # A worker counts an answer just after sending it, so a scrape sent the moment the last
        # answer arrives can beat the count on a starved machine: wait for it once, then every
        # scrape, whichever worker reads the shared files, must say the same.
        _until(lambda: _scrape(api.url).get(ok, 0.0) - before >= REQUESTS, 10.0)
        scrapes = [_scrape(api.url) for _ in range(2 * WORKERS + 2)]
        for samples in scrapes:
            assert samples[ok] - before == REQUESTS
            assert samples["recsys_workers{}"] == WORKERS
            assert samples["recsys_in_flight_requests{}"] == 0


def test_sigterm_stops_every_worker_and_removes_the_metrics(stack: Stack, tmp_path: Path) -> None:
    with workers_api(stack, tmp_path) as api:
        _until(lambda: _scrape(api.url).get("recsys_workers{}") == WORKERS)
        children = _children(api.pid)  # the workers, and multiprocessing's resource tracker
        shared = _metrics_dir(children)
        assert any(shared.glob("counter_*.db"))
        status = api.stop()
    assert status == 0, api.log_tail()
    assert not shared.exists()
    # The tracker exits when it sees its parent's pipe close, a moment after the parent.
    _until(lambda: not [pid for pid in children if Path(f"/proc/{pid}").exists()], 5.0)


# The worker count set either way: every worker must know it to tell the others of a reload.
@pytest.mark.parametrize("how", ["setting", "flag"])
def test_a_reload_reaches_every_worker(stack: Stack, tmp_path: Path, how: str) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(PLAIN_RULES)
    token = "workers-test-token-0123456789"
    count = {"workers": str(WORKERS)} if how == "setting" else {}
    flag = ["--workers", str(WORKERS)] if how == "flag" else []
    with api_process(
        stack, tmp_path, args=flag, rules_file=str(rules), admin_token=token, **count
    ) as api:
        _until(lambda: _scrape(api.url).get("recsys_workers{}") == WORKERS)

        def applied() -> float:
            return _scrape(api.url).get("recsys_reloads_total{outcome=applied}", 0.0)

        # systemctl reload: the signal goes to the supervisor, which hands it to each worker.
        rules.write_text("[diversity]\nmax_per_category = 2\n")
        os.kill(api.pid, signal.SIGUSR1)
        _until(lambda: applied() == WORKERS)
        # /admin reaches one worker: it reloads, and has the supervisor tell the others.
        rules.write_text("[diversity]\nmax_per_category = 3\n")
        answer = httpx.post(
            f"{api.url}/admin/reload", headers={"authorization": f"Bearer {token}"}, timeout=10
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["generation"] == 3
        _until(lambda: applied() == 2 * WORKERS)
        labels = {
            httpx.post(f"{api.url}/recommend", json={"user_id": f"u{n}"}, timeout=5).json()[
                "artifacts"
            ]
            for n in range(4 * WORKERS)
        }
        assert labels == {answer.json()["artifacts"]}
        assert _scrape(api.url)["recsys_release_generation{}"] == 3
        # Each worker logs what it serves after a reload, as one process would.
        assert api.log_tail(400).count("release 3 serves") == WORKERS
        assert api.stop() == 0, api.log_tail()


def _until_logged(api: ApiProcess, text: str, processes: int = 1, timeout_s: float = 30.0) -> None:
    """Until `processes` different processes have logged `text` (a line names its pid)."""

    def logged_by() -> set[str]:
        return set(re.findall(rf"\[(\d+)\] \S+ {re.escape(text)}", api.log_tail(400)))

    _until(lambda: len(logged_by()) >= processes, timeout_s)


# A reload signal while the service starts (systemctl reload, or another worker's /admin
# call) once killed the process it reached: SIGUSR1's default action, before the handler.
@pytest.fixture
def api_port() -> Iterator[int]:
    with leased_port() as port:
        yield port


@pytest.mark.parametrize("workers", [1, WORKERS])
def test_a_reload_signal_during_start_up_is_kept_for_after_it(
    stack: Stack,
    own_triton: tuple[ManagedProcess, str],
    tmp_path: Path,
    workers: int,
    api_port: int,
) -> None:
    triton, url = own_triton
    triton.kill()  # start-up waits for it: time to signal the service mid-start
    rules = tmp_path / "rules.toml"
    rules.write_text(PLAIN_RULES)
    env = {
        "RECSYS_REDIS_URL": stack.redis_url,
        "RECSYS_TRITON_URL": url,
        "RECSYS_ARTIFACTS_DIR": str(stack.world),
        "RECSYS_RULES_FILE": str(rules),
        "RECSYS_WORKERS": str(workers),
    }
    api = spawn_api(env, tmp_path / "api.log", api_port)  # not waited for: signalled mid-start
    try:
        # Every worker has read the rules (a worker that read the changed file reloads to no
        # change, which is not counted as applied): the change must come by the reload missed.
        _until_logged(api, "waiting for the triton model", processes=workers)
        rules.write_text("[diversity]\nmax_per_category = 2\n")
        os.kill(api.pid, signal.SIGUSR1)
        time.sleep(0.5)
        assert api.process.poll() is None, api.log_tail()
        triton.restart()
        api.wait_ready()

        def applied() -> float:
            return _scrape(api.url).get("recsys_reloads_total{outcome=applied}", 0.0)

        # Every worker reloads once it has started; none died of the signal.
        _until(lambda: applied() == workers)
        assert "Child process" not in api.log_tail(400)  # uvicorn logs a worker that died
    finally:
        assert api.stop() == 0, api.log_tail()
