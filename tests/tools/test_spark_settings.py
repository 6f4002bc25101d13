"""The Spark engine's settings from the command line: --spark-conf pairs, one host's defaults."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pyspark")

from recsys_tools.world.spark.session import _local_defaults, _mapped, parse_conf

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
    assert str(_mapped(wrapped)) == "log.csv: 'x' is bad"
    assert str(_mapped(RuntimeError("Java heap space\nmore"))) == (
        "a Spark job failed: Java heap space"
    )
