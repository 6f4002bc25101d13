"""The Spark engine's settings from the command line: --spark-conf pairs, one host's defaults."""

from __future__ import annotations

import os
import sys

import pytest
from recsys_tools.world.spark.session import (
    _executor_python,
    _local_defaults,
    _mapped,
    _python_for_tasks,
    parse_conf,
)

from app.core.errors import ConfigError


def test_conf_pairs_are_split_at_the_first_equals_sign() -> None:
    assert parse_conf(["spark.driver.memory=8g", " spark.x = a=b "]) == (
        ("spark.driver.memory", "8g"),
        ("spark.x", "a=b"),
    )
    with pytest.raises(ConfigError, match=r"--spark-conf 'spark\.driver\.memory'"):
        parse_conf(["spark.driver.memory"])


def test_one_host_shuffles_in_a_few_partitions_a_cluster_keeps_its_own() -> None:
    assert _local_defaults("local[2]") == {"spark.sql.shuffle.partitions": "4"}
    assert _local_defaults("local[3,2]") == {"spark.sql.shuffle.partitions": "6"}
    assert _local_defaults("local") == {"spark.sql.shuffle.partitions": "2"}
    cores = os.cpu_count() or 1
    assert _local_defaults("local[*]") == {"spark.sql.shuffle.partitions": str(2 * cores)}
    assert _local_defaults("spark://10.0.0.1:7077") == {}
    assert _local_defaults("yarn") == {}


def test_a_tasks_config_error_keeps_its_message_other_failures_name_the_job() -> None:
    wrapped = RuntimeError(
        "Job aborted\nTraceback...\napp.core.errors.ConfigError: log.csv: 'x' is bad\n\tat org"
    )
    assert str(_mapped(wrapped, "/venv/bin/python")) == "log.csv: 'x' is bad"
    assert str(_mapped(RuntimeError("Java heap space\nmore"), "/venv/bin/python")) == (
        "a Spark job failed: Java heap space"
    )


def test_a_task_without_the_tools_names_its_interpreter_and_the_setting() -> None:
    wrapped = RuntimeError(
        "An exception was thrown from the Python worker:\nTraceback...\n"
        "ModuleNotFoundError: No module named 'recsys_tools'\n SQLSTATE: 38000"
    )
    message = str(_mapped(wrapped, "/usr/bin/python3"))
    assert "/usr/bin/python3" in message
    assert "'recsys_tools'" in message
    assert "spark.pyspark.python" in message
    assert "\n" not in message


def test_tasks_run_this_interpreter_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pyspark starts its tasks with PYSPARK_PYTHON, else `python3` on PATH: a build run
    # without its virtualenv on PATH must still hand the tasks the tools' interpreter.
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert _executor_python({}) == sys.executable
    assert _executor_python({"spark.pyspark.python": "/opt/py"}) == "/opt/py"
    with _python_for_tasks(sys.executable):
        assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert "PYSPARK_PYTHON" not in os.environ
    monkeypatch.setenv("PYSPARK_PYTHON", "/srv/py")
    assert _executor_python({}) == "/srv/py"
    with _python_for_tasks("/opt/py"):
        assert os.environ["PYSPARK_PYTHON"] == "/opt/py"
    assert os.environ["PYSPARK_PYTHON"] == "/srv/py"
