"""The service's metrics through real Prometheus tooling.

`promtool check metrics` lints the service's /metrics; then a real Prometheus, with the
project's configuration (intervals and targets swapped for the test's) and rule file, scrapes
the API running as its own process and a Triton started here with its metrics port, while
the test sends a few hundred requests, and its query API must answer with sane figures: the
rank stage's recorded p99 inside the budget, Triton's request count covering the traffic,
every rule evaluating without error and no alert firing.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from recsys_tools.localstack import (
    Launch,
    ManagedProcess,
    default_triton_env,
    start_archive,
    start_ingest,
    start_managed_on_ports,
    start_triton,
)

from loadtest.service import ApiProcess, start_api
from tests.debian_tools import debian_root
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
REQUESTS = 400
NUM_ITEMS = 10
BUDGET_S = 0.100
# How long Prometheus may take to scrape, evaluate and show what the traffic did (it applies
# its first targets about 5 s after its start).
SETTLE_S = 30.0


@dataclass(frozen=True)
class PrometheusTools:
    prometheus: Path
    promtool: Path


@pytest.fixture(scope="module")
def tools() -> PrometheusTools:
    """Prometheus and promtool 2.42 from Debian bookworm, cached under var/tools."""
    bin_dir = debian_root("bookworm", "prometheus") / "usr" / "bin"
    return PrometheusTools(bin_dir / "prometheus", bin_dir / "promtool")


def check_metrics(promtool: Path, exposition: str) -> None:
    """promtool's lint of an exposition: it must exit 0 and print nothing."""
    result = subprocess.run(
        [str(promtool), "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool check metrics:\n{output}"
    assert not output.strip(), f"promtool check metrics:\n{output}"


async def test_service_metrics_pass_promtool_lint(
    client: httpx.AsyncClient, tools: PrometheusTools
) -> None:
    # An answer and a refusal first, so the histograms and counters carry samples.
    assert (await client.post("/recommend", json={"user_id": "u1", "num_items": 5})).is_success
    assert (
        await client.post("/recommend", json={"user_id": "u1", "num_items": 0})
    ).status_code == 422
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert "recsys_stage_duration_seconds_bucket" in response.text
    check_metrics(tools.promtool, response.text)


def prometheus_config(
    rules_dir: Path, api: str, triton_metrics: str, ingest: str, archive: str
) -> str:
    """The project's prometheus.yml with 1 s intervals, the test's targets and rule path."""
    text = (PROMETHEUS_DIR / "prometheus.yml").read_text()
    for old, new in (
        ("scrape_interval: 15s", "scrape_interval: 1s"),
        ("evaluation_interval: 15s", "evaluation_interval: 1s"),
        ('"recsys-api:8080"', f'"{api}"'),
        ('"recsys-triton:8002"', f'"{triton_metrics}"'),
        ('"recsys-ingest:9108"', f'"{ingest}"'),
        ('"recsys-archive:9109"', f'"{archive}"'),
        ("- rules/*.yml", f"- {rules_dir}/*.yml"),
    ):
        assert text.count(old) == 1, f"prometheus.yml no longer has {old!r} once"
        text = text.replace(old, new)
    return text


@dataclass
class Prometheus:
    process: ManagedProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.process.ports['web']}"

    def log_tail(self) -> str:
        return self.process.log_tail()

    def get(self, path: str, **params: str) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=5.0)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The value of a query that yields one series, or None while it yields none."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr} gave several series: {result}"
        return float(result[0]["value"][1]) if result else None

    def number(self, expr: str) -> float:
        """The value of a query that must yield exactly one series."""
        value = self.value(expr)
        assert value is not None, f"{expr} gave nothing"
        return value


@contextmanager
def running_prometheus(binary: Path, config: str, workdir: Path) -> Iterator[Prometheus]:
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(config)

    def launch(ports: Mapping[str, int]) -> Launch:
        argv = (
            str(binary),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{ports['web']}",
            "--log.level=warn",
        )
        ready = lambda: _ready(f"http://127.0.0.1:{ports['web']}")  # noqa: E731
        return Launch(argv, dict(os.environ), ready, ready_timeout_s=20.0)

    process = start_managed_on_ports("prometheus", ["web"], launch, workdir / "prometheus.log")
    try:
        yield Prometheus(process)
    finally:
        process.stop()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def wait_until(
    condition: Callable[[], bool], timeout_s: float, what: str, context: Callable[[], str]
) -> None:
    give_up = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"not {what} within {timeout_s}s:\n{context()}")
        time.sleep(0.2)


@contextmanager
def api_on(stack: Stack, triton_url: str, workdir: Path) -> Iterator[ApiProcess]:
    env = {
        "RECSYS_REDIS_URL": stack.redis_url,
        "RECSYS_TRITON_URL": triton_url,
        "RECSYS_ARTIFACTS_DIR": str(stack.world),
        "RECSYS_REQUEST_BUDGET_MS": str(BUDGET_S * 1000),
    }
    api = start_api(env, workdir / "api.log")
    try:
        yield api
    finally:
        api.stop()


def send_traffic(api: ApiProcess) -> int:
    """REQUESTS sequential requests for users u0..; how many Triton ranked (no rank fallback)."""
    ranked = 0
    with httpx.Client(base_url=api.url, timeout=5.0) as client:
        for user in range(REQUESTS):
            response = client.post(
                "/recommend", json={"user_id": f"u{user}", "num_items": NUM_ITEMS}
            )
            assert response.status_code == 200, response.text
            body = response.json()
            assert len(body["items"]) == NUM_ITEMS, body
            if not any(flag.startswith("rank:") for flag in body["degraded"]):
                ranked += 1
    return ranked


def test_prometheus_scrapes_the_service_and_triton(
    stack: Stack, tools: PrometheusTools, tmp_path: Path
) -> None:
    model = stack.schema.model_name
    triton_count = f'sum(nv_inference_request_success{{job="triton", model="{model}"}})'
    served = 'sum(recsys_requests_total{job="recsys-api", outcome=~"ok|degraded"})'
    rank_p99 = 'job_stage:recsys_stage_duration_seconds:p99_rate1m{stage="rank"}'

    with ExitStack() as running:
        # Prometheus last, its targets the ports every server has bound.
        triton, triton_url = start_triton(
            default_triton_env(), stack.model_repository, tmp_path / "triton", [model], metrics=True
        )
        running.callback(triton.stop)
        api = running.enter_context(api_on(stack, triton_url, tmp_path / "api"))
        ingest_settings = {
            "RECSYS_REDIS_URL": stack.redis_url,
            "RECSYS_ARTIFACTS_DIR": str(stack.world),
        }
        consumer = start_ingest(ingest_settings, tmp_path / "ingest", metrics=True)
        running.callback(consumer.stop)
        archive_settings = {
            "RECSYS_REDIS_URL": stack.redis_url,
            "RECSYS_ARCHIVE_URI": str(tmp_path / "archived"),
        }
        archive = start_archive(archive_settings, tmp_path / "archive", metrics=True)
        running.callback(archive.stop)
        config = prometheus_config(
            PROMETHEUS_DIR / "rules",
            api=f"127.0.0.1:{api.port}",
            triton_metrics=f"127.0.0.1:{triton.ports['metrics']}",
            ingest=f"127.0.0.1:{consumer.ports['metrics']}",
            archive=f"127.0.0.1:{archive.ports['metrics']}",
        )
        prometheus = running.enter_context(
            running_prometheus(tools.prometheus, config, tmp_path / "prometheus")
        )

        def context() -> str:
            targets = prometheus.get("/api/v1/targets")["activeTargets"]
            health = [(t["labels"]["job"], t["health"], t["lastError"]) for t in targets]
            values = {q: prometheus.query(q) for q in (triton_count, served, rank_p99)}
            return f"targets: {health}\nvalues: {values}\n{prometheus.log_tail()}"

        def all_up() -> bool:
            # Every target scraped, under the project's job names, before any traffic: the
            # rates need a sample from before it.
            ups = {r["metric"]["job"]: float(r["value"][1]) for r in prometheus.query("up")}
            every = ("recsys-api", "triton", "recsys-ingest", "recsys-archive")
            return ups == dict.fromkeys(every, 1.0)

        wait_until(all_up, SETTLE_S, "scraping every target", context)
        assert prometheus.number("recsys_ingest_lag_seconds") == 0.0  # the alert's series
        before = prometheus.number(triton_count)

        ranked = send_traffic(api)
        assert ranked >= REQUESTS * 0.9, f"only {ranked} of {REQUESTS} ranked by Triton"
        check_metrics(tools.promtool, httpx.get(f"{api.url}/metrics", timeout=5.0).text)

        def caught_up() -> bool:
            # The last scrape has all the traffic and the rules have run on it since.
            count, answered, p99 = (prometheus.value(q) for q in (triton_count, served, rank_p99))
            return (
                count is not None
                and count - before >= ranked
                and answered == REQUESTS
                and p99 is not None
                and math.isfinite(p99)
            )

        wait_until(caught_up, SETTLE_S, "caught up with the traffic", context)

        # Stage latency, recorded by the project's rules from the service's histograms.
        p99 = prometheus.number(rank_p99)
        p50 = prometheus.number('job_stage:recsys_stage_duration_seconds:p50_rate1m{stage="rank"}')
        assert 0 < p50 <= p99 < BUDGET_S, (p50, p99)
        direct = prometheus.number(
            "histogram_quantile(0.99, sum by (le) "
            '(rate(recsys_stage_duration_seconds_bucket{stage="rank"}[1m])))'
        )
        assert 0 < direct < BUDGET_S, direct

        # Triton's own figures: at least one request per ranked answer (large candidate sets
        # go in several chunks), per-request times inside the budget, rows per execution.
        count = prometheus.number(triton_count) - before
        assert ranked <= count, (count, ranked)
        for name in (
            "job_model:nv_inference_queue_duration_seconds:mean_rate1m",
            "job_model:nv_inference_compute_infer_duration_seconds:mean_rate1m",
            "job_model:nv_inference_request_duration_seconds:mean_rate1m",
        ):
            seconds = prometheus.number(f'{name}{{model="{model}"}}')
            assert 0 <= seconds < BUDGET_S, (name, seconds)
        rows = prometheus.number(f'job_model:nv_inference_count:per_exec_rate1m{{model="{model}"}}')
        assert rows >= 1, rows
        # The figures, for -s runs.
        print(f"rank p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms; Triton requests {count:.0f}")
        print(f"for {ranked} ranked answers, {rows:.0f} rows per execution")

        # Every rule of the project evaluates against the real series, and nothing fires.
        groups = prometheus.get("/api/v1/rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        assert len(rules) > 20
        broken = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert not broken, broken
        alerts = prometheus.get("/api/v1/alerts")["alerts"]
        firing = [alert["labels"] for alert in alerts if alert["state"] == "firing"]
        assert not firing, firing
