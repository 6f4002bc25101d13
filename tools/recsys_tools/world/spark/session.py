"""The Spark session a build runs its jobs in, and Spark's failures mapped to the service's.

The master and any setting come from the command line (--spark-master, --spark-conf): local[*]
on one host, spark://host:7077 for a standalone cluster, yarn or k8s://... elsewhere. pyspark
is imported by this room only, which the command line imports only for --engine spark: the
local engine never needs it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import SparkSession

from app.core.errors import ConfigError

log = logging.getLogger("recsys.build")

# Settings every build gets unless --spark-conf says otherwise: times read as UTC (the
# local engine's clock), no progress bars in the build's log.
DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
# What a ConfigError raised inside a Python task looks like once Spark has wrapped it.
_CONFIG_ERROR = re.compile(r"ConfigError: (.+)")
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


@dataclass(frozen=True, slots=True)
class SparkSettings:
    master: str
    conf: tuple[tuple[str, str], ...]
    # Rows of the log (every row of a sample of users) the driver gathers to train the
    # ranker and judge the world on.
    sample_rows: int


class SparkJobError(ConfigError):
    """A Spark job failed for a reason other than the operator's data."""


def parse_conf(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    """KEY=VALUE pairs from --spark-conf, refused with the flag's name when malformed."""
    parsed = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"--spark-conf {pair!r}: give KEY=VALUE, such as spark.driver.memory=4g"
            )
        parsed.append((key.strip(), value.strip()))
    return tuple(parsed)


def _local_defaults(master: str) -> dict[str, str]:
    """On one host, a shuffle in a few partitions per core, not Spark's 200: the build's
    jobs are many and short, and each partition costs a task (a cluster sets its own)."""
    found = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]|local", master)
    if found is None:
        return {}
    cores = found.group(1) if found.lastindex else "1"
    count = (os.cpu_count() or 1) if cores == "*" else int(cores)
    return {"spark.sql.shuffle.partitions": str(max(2 * count, 2))}


def _check_java() -> None:
    home = os.environ.get("JAVA_HOME")
    if (home and os.path.exists(os.path.join(home, "bin", "java"))) or shutil.which("java"):
        return
    raise ConfigError(
        "build-world --engine spark needs a Java runtime (17 or newer) and none was found: "
        "install one (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
    )


@contextmanager
def spark_session(settings: SparkSettings) -> Iterator[SparkSession]:
    """A session on `settings.master`; stopped on the way out, whatever happened."""
    _check_java()
    builder = SparkSession.builder.master(settings.master).appName("recsys build-world")
    options = {**DEFAULTS, **_local_defaults(settings.master), **dict(settings.conf)}
    python = _executor_python(options)
    options["spark.pyspark.python"] = python
    for key, value in options.items():
        builder = builder.config(key, value)
    try:
        with _python_for_tasks(python):
            spark = builder.getOrCreate()
    except Exception as exc:  # py4j and the JVM launcher raise plain exceptions
        raise SparkJobError(
            f"could not start Spark on --spark-master {settings.master}: {_first_line(exc)}"
        ) from None
    spark.sparkContext.setLogLevel("ERROR")
    log.info(
        "Spark %s on %s (%d cores by default parallelism)",
        spark.version,
        settings.master,
        spark.sparkContext.defaultParallelism,
    )
    try:
        yield spark
    except ConfigError:
        raise
    except Exception as exc:
        raise _mapped(exc, python) from None
    finally:
        spark.stop()


def _executor_python(options: dict[str, str]) -> str:
    """The interpreter the tasks run: --spark-conf spark.pyspark.python, else PYSPARK_PYTHON,
    else this one, which has the tools installed. A cluster's workers must have that
    environment at that path (README, Beyond one machine)."""
    return options.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or sys.executable


@contextmanager
def _python_for_tasks(python: str) -> Iterator[None]:
    """pyspark reads the tasks' interpreter from PYSPARK_PYTHON when its context starts, not
    from spark.pyspark.python (only spark-submit maps one to the other); without it the
    tasks run whatever `python3` is first on PATH, which need not have the tools."""
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = python
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYSPARK_PYTHON"]
        else:
            os.environ["PYSPARK_PYTHON"] = before


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _mapped(exc: Exception, python: str) -> ConfigError:
    """A task's ConfigError (a bad time in the log, say) keeps its message; a task whose
    interpreter lacks the tools names that interpreter; any other failure names the job's
    first line."""
    text = str(exc)
    found = _CONFIG_ERROR.search(text)
    if found is not None:
        return ConfigError(found.group(1).strip())
    missing = _MISSING_MODULE.search(text)
    if missing is not None:
        return SparkJobError(
            f"Spark's tasks run {python}, which lacks the module {missing.group(1)!r}: install "
            "recsys-tools[spark] there, or name an interpreter that has it with "
            "--spark-conf spark.pyspark.python=PATH"
        )
    return SparkJobError(f"a Spark job failed: {_first_line(exc)}")
