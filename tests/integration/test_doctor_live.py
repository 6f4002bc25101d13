"""`recsys doctor`'s service checks against the real Redis and Triton of the session stack."""

from __future__ import annotations

import argparse
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from recsys_tools.doctor import Status, add_doctor_options, run_doctor
from recsys_tools.doctor.services import (
    ServiceConfig,
    check_redis,
    check_redis_memory,
    check_triton,
)

from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


def _config(stack: Stack) -> ServiceConfig:
    return ServiceConfig(
        redis_url=stack.redis_url,
        key_prefix="recsys",
        triton_url=stack.triton_url,
        model_name=stack.schema.model_name,
        model_version="",
        schema=stack.schema,
    )


def test_redis_memory_is_read_from_the_live_server(stack: Stack) -> None:
    outcome = check_redis_memory(_config(stack))
    # The tests' Redis runs without maxmemory, which a deployment must not.
    assert outcome.status is Status.WARN, outcome
    assert "no limit" in outcome.finding
    assert "the event streams may hold up to" in outcome.finding
    assert outcome.remedy is not None
    assert "maxmemory" in outcome.remedy


def test_triton_and_redis_of_the_stack_pass(stack: Stack) -> None:
    triton = check_triton(_config(stack))
    assert triton.status is Status.OK, triton
    assert f"model {stack.schema.model_name!r}" in triton.finding
    assert f"{stack.schema.width} FP32 columns" in triton.finding
    redis = check_redis(_config(stack))
    assert redis.status is Status.OK, redis
    assert "recsys:meta matches the feature schema" in redis.finding


def test_a_redis_nobody_listens_on_fails(stack: Stack, tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/nobody.sock"
    outcome = check_redis(replace(_config(stack), redis_url=url, timeout_s=1.0))
    assert outcome.status is Status.FAIL
    assert outcome.finding.startswith(f"Redis at {url} did not answer")
    assert "RECSYS_REDIS_URL" in (outcome.remedy or "")


def test_redis_with_another_key_prefix_has_no_layout(stack: Stack) -> None:
    outcome = check_redis(replace(_config(stack), key_prefix="elsewhere"))
    assert outcome.status is Status.FAIL
    assert "Redis has no elsewhere:meta" in outcome.finding
    assert "recsys load-redis" in (outcome.remedy or "")


def test_a_wrong_model_name_fails_naming_the_models_triton_has(stack: Stack) -> None:
    outcome = check_triton(replace(_config(stack), model_name="no_such_model"))
    assert outcome.status is Status.FAIL
    assert f"Triton at {stack.triton_url} has no model 'no_such_model'" in outcome.finding
    assert stack.schema.model_name in outcome.finding
    assert "RECSYS_MODEL_NAME" in (outcome.remedy or "")


def test_a_model_version_triton_does_not_have_fails(stack: Stack) -> None:
    outcome = check_triton(replace(_config(stack), model_version="7"))
    assert outcome.status is Status.FAIL
    assert f"has model {stack.schema.model_name!r} but not version 7" in outcome.finding
    assert "RECSYS_MODEL_VERSION" in (outcome.remedy or "")


def test_a_triton_nobody_listens_on_fails(stack: Stack) -> None:
    outcome = check_triton(replace(_config(stack), triton_url="127.0.0.1:9", timeout_s=1.0))
    assert outcome.status is Status.FAIL
    assert outcome.finding.startswith("Triton at 127.0.0.1:9 is unreachable")


def test_the_command_checks_the_services_it_is_pointed_at(stack: Stack, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_doctor_options(parser)
    args = parser.parse_args(
        [
            "--json",
            "--root",
            str(tmp_path),  # an empty root: the host checks fail, the services do not
            "--units",
            str(tmp_path),
            "--redis-url",
            stack.redis_url,
            "--triton-url",
            stack.triton_url,
        ]
    )
    out = io.StringIO()
    assert run_doctor(args, out=out) == 1
    report = {f["check"]: f for f in json.loads(out.getvalue())["findings"]}
    assert report["triton"]["status"] == "ok", report["triton"]
    assert report["redis"]["status"] == "ok", report["redis"]
    args.model_name = "no_such_model"
    out = io.StringIO()
    run_doctor(args, out=out)
    report = {f["check"]: f for f in json.loads(out.getvalue())["findings"]}
    assert report["triton"]["status"] == "fail"
    assert "no_such_model" in report["triton"]["finding"]
