"""The Prometheus configuration, rules and Grafana dashboard, checked by promtool (no servers).

promtool comes from the Debian package (deploy/tools/fetch-deb, cached under var/tools):
the configuration and the rules must load, the rules' unit tests must pass, and every query
of the dashboard must parse as PromQL.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.debian_tools import debian_root

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULES = PROMETHEUS_DIR / "rules" / "recsys.yml"
RULE_TESTS = PROMETHEUS_DIR / "tests" / "recsys_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "recsys.json"

# Grafana's built-in interval variables, replaced by a duration before promtool parses a query.
GRAFANA_DURATIONS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}
# The dashboard's own variables, replaced by a value they take on a host.
VARIABLE_VALUES = {"job": "recsys-api", "triton_job": "triton"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
RECORDED_NAME = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")
SEVERITIES = {"critical", "warning"}
# Promtool reports problems under these words even when some checks pass.
PROBLEM = re.compile(r"FAILED|WARNING|\berror\b", re.IGNORECASE)


def fetch_promtool() -> Path:
    """promtool 2.42 from Debian bookworm, fetched once and cached under var/tools."""
    promtool = debian_root("bookworm", "prometheus") / "usr" / "bin" / "promtool"
    assert promtool.exists(), f"no promtool at {promtool}"
    return promtool


@pytest.fixture(scope="module")
def promtool() -> Path:
    return fetch_promtool()


def run_promtool(promtool: Path, *args: str, cwd: Path = ROOT) -> str:
    """Run promtool; fail on a non-zero status or any problem it prints. Returns its output."""
    result = subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, check=False, cwd=cwd, timeout=60
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{output}"
    assert not PROBLEM.search(output), f"promtool {' '.join(args)}:\n{output}"
    return output


def load_dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def graph_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel but rows, including those inside collapsed rows."""
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) for every query of every panel."""
    return [
        (f"panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"])
        for panel in graph_panels(dashboard)
        for target in panel["targets"]
    ]


def substitute_variables(expr: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in GRAFANA_DURATIONS:
            return GRAFANA_DURATIONS[name]
        assert name in VARIABLE_VALUES, f"unknown dashboard variable ${name} in {expr}"
        return VARIABLE_VALUES[name]

    return VARIABLE.sub(value, expr)


def recorded_names() -> set[str]:
    return set(re.findall(r"^\s*- record:\s*(\S+)\s*$", RULES.read_text(), re.MULTILINE))


def alert_blocks() -> dict[str, str]:
    """Each alerting rule's text, by alert name (the rules file lists alerts last)."""
    text = RULES.read_text()
    parts = re.split(r"^\s*- alert:\s*", text, flags=re.MULTILINE)[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


def test_config_is_valid_and_loads_the_rules(promtool: Path) -> None:
    output = run_promtool(promtool, "check", "config", str(CONFIG.relative_to(ROOT)))
    assert "SUCCESS: 1 rule files found" in output, output


def test_config_scrapes_the_api_and_triton_on_loopback() -> None:
    text = CONFIG.read_text()
    for job, target in (("recsys-api", "recsys-api:8080"), ("triton", "recsys-triton:8002")):
        block = text.split(f"job_name: {job}\n", 1)
        assert len(block) == 2, f"no scrape job {job}"
        assert f'targets: ["{target}"]' in block[1].split("job_name:", 1)[0], job
    assert "0.0.0.0" not in re.sub(r"#.*", "", text)


def test_rules_are_valid(promtool: Path) -> None:
    output = run_promtool(promtool, "check", "rules", str(RULES))
    assert "SUCCESS" in output, output


def test_rule_unit_tests_pass(promtool: Path) -> None:
    output = run_promtool(promtool, "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert "SUCCESS" in output, output


def test_every_alert_is_tested_firing_and_quiet() -> None:
    tests = RULE_TESTS.read_text()
    for name in alert_blocks():
        firing = re.search(rf"alertname: {name}\n\s*exp_alerts:\n\s*- exp_labels:", tests)
        quiet = re.search(rf"alertname: {name}(, |\n\s*)exp_alerts: \[\]", tests)
        assert firing, f"{name} is never tested firing"
        assert quiet, f"{name} is never tested quiet"


def test_alerts_have_for_severity_and_annotations() -> None:
    alerts = alert_blocks()
    assert set(alerts) >= {
        "RecsysRequestP99OverBudget",
        "RecsysErrorRateHigh",
        "RecsysDegradedShareHigh",
        "RecsysShedShareHigh",
        "RecsysCircuitBreakerOpen",
        "RecsysApiNotReady",
        "TritonDown",
        "TritonGpuMemoryNearFull",
    }
    for name, block in alerts.items():
        assert re.search(r"^\s+for: \d+[smh]$", block, re.MULTILINE), f"{name}: no for:"
        severity = re.search(r"^\s+severity: (\w+)$", block, re.MULTILINE)
        assert severity, f"{name}: no severity label"
        assert severity.group(1) in SEVERITIES, name
        assert re.search(r"^\s+summary: ", block, re.MULTILINE), f"{name}: no summary"
        assert re.search(r"^\s+description: ", block, re.MULTILINE), f"{name}: no description"
    # The budget is the one number to find and change with RECSYS_REQUEST_BUDGET_MS.
    assert "> 0.100\n" in alerts["RecsysRequestP99OverBudget"]


def test_dashboard_queries_parse_as_promql(promtool: Path, tmp_path: Path) -> None:
    queries = dashboard_queries(load_dashboard())
    assert queries
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for index, (where, expr) in enumerate(queries):
        concrete = substitute_variables(expr)
        assert "$" not in concrete, f"{where}: {expr}"
        lines.append(f"      - record: dashboard:query_{index}:expr")
        # A JSON string is a YAML string: no quoting rules of our own.
        lines.append(f"        expr: {json.dumps(concrete)}")
    rules = tmp_path / "dashboard-rules.yml"
    rules.write_text("\n".join(lines) + "\n")
    output = run_promtool(promtool, "check", "rules", str(rules))
    assert f"SUCCESS: {len(queries)} rules found" in output, output


def test_dashboard_structure() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"]
    assert dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    datasource = variables["datasource"]
    assert datasource["type"] == "datasource"
    assert datasource["query"] == "prometheus"
    assert set(variables) == {"datasource", *VARIABLE_VALUES}

    ids = [panel["id"] for panel in dashboard["panels"]]
    ids += [p["id"] for row in dashboard["panels"] for p in row.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in graph_panels(dashboard):
        where = f"panel {panel['id']} {panel['title']!r}"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, where
        assert grid["h"] > 0, where
        assert panel["targets"], where
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), where
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], where
            assert target["expr"].strip(), where


def test_dashboard_uses_only_recorded_series_that_exist() -> None:
    recorded = recorded_names()
    used = {
        name
        for _, expr in dashboard_queries(load_dashboard())
        for name in RECORDED_NAME.findall(expr)
    }
    assert used <= recorded, f"not recorded by {RULES.name}: {sorted(used - recorded)}"
    # What the dashboard is for: traffic, stage latency, fallbacks, shedding, batching.
    assert used >= {
        "job_outcome:recsys_requests:rate1m",
        "job_stage:recsys_stage_duration_seconds:p50_rate1m",
        "job_stage:recsys_stage_duration_seconds:p99_rate1m",
        "job:recsys_requests_degraded:ratio_rate5m",
        "job:recsys_requests_shed:ratio_rate5m",
        "job_model:nv_inference_queue_duration_seconds:mean_rate1m",
        "job_model:nv_inference_compute_infer_duration_seconds:mean_rate1m",
        "job_model:nv_inference_count:per_exec_rate1m",
        "job_model:nv_inference_request_success:per_exec_rate1m",
    }
    exprs = " ".join(expr for _, expr in dashboard_queries(load_dashboard()))
    assert "recsys_breaker_state" in exprs
    assert "recsys_in_flight_requests" in exprs
    # And what changes under it: the answering variant, the shadow's agreement, reloads.
    for name in ("recsys_model_answers_total", "recsys_shadow_agreement", "recsys_reloads_total"):
        assert name in exprs, name


def test_grafana_provisions_the_dashboard_over_the_hosts_prometheus() -> None:
    """What recsys-grafana mounts: the data source names the Prometheus container it can
    reach, and the dashboard provider reads the directory the dashboard is mounted at."""
    from tests.deploy.test_units import QUADLET_DIR, parse_unit

    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    source = _yaml_values((provisioning / "datasources" / "recsys.yml").read_text())
    assert source["type"] == ["prometheus"]
    assert source["url"] == ["http://recsys-prometheus:9090"]
    grafana = parse_unit((QUADLET_DIR / "recsys-grafana.container").read_text())["Container"]
    prometheus = parse_unit((QUADLET_DIR / "recsys-prometheus.container").read_text())
    assert prometheus["Container"]["ContainerName"] == ["recsys-prometheus"]
    # Both on the recsys bridge, where Podman's DNS resolves container names.
    assert set(grafana["Network"]) & set(prometheus["Container"]["Network"]) == {"recsys.network"}
    provider = _yaml_values((provisioning / "dashboards" / "recsys.yml").read_text())
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["Volume"]}
    (path,) = provider["path"]
    assert mounts[path] == "/etc/recsys/grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "/etc/recsys/grafana/provisioning"


def _yaml_values(text: str) -> dict[str, list[str]]:
    """Every `key: value` line of a small YAML file, by key (each file here names one
    data source or one provider, so a key's values are that one's)."""
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, colon, value = line.strip().removeprefix("- ").partition(":")
        if colon and value.strip() and not line.lstrip().startswith("#"):
            values.setdefault(key.strip(), []).append(value.strip())
    return values
