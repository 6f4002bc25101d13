"""A standalone Spark cluster on loopback: one master and its workers, each a process of its
own started by Spark's own launch classes (the jars pyspark ships), stopped by pid.

It is what `build-world --engine spark --spark-master spark://...` meets on a real cluster,
on one host: the driver, the master and the executors talk over the network, and the
executors run the build's Python in worker processes of their own.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

from app.core.errors import ConfigError
from recsys_tools.localstack.ports import LOOPBACK
from recsys_tools.localstack.processes import (
    Launch,
    ManagedProcess,
    start_managed,
)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_S = 90.0
# Every port is 0: each process binds one the kernel gives it, so none can be taken between
# choosing and binding; the master's is read back from what it logs.
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")


def spark_home() -> Path:
    """The Spark that pyspark ships: its jars and launch scripts."""
    found = importlib.util.find_spec("pyspark")
    if found is None or found.origin is None:
        raise ConfigError("pyspark is not installed: pip install 'recsys-tools[spark]'")
    return Path(found.origin).parent


def _said(path: Path, line: str) -> bool:
    try:
        return line in path.read_text(errors="replace")
    except OSError:
        return False


def _launch(args: list[str], log_path: Path, ready_line: str, workdir: Path) -> Launch:
    home = spark_home()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOG_DIR": str(workdir),
        "PYSPARK_PYTHON": sys.executable,
    }
    argv = ("bash", str(home / "bin" / "spark-class"), *args)
    return Launch(argv, env, lambda: _said(log_path, ready_line), START_TIMEOUT_S)


def start_spark_cluster(
    workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g"
) -> tuple[list[ManagedProcess], str]:
    """A master and `workers` workers of `cores` cores and `memory` each; returns them (the
    master first) and the master's spark:// URL once every worker has registered."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "master.log"
    master_args = [MASTER_CLASS, "--host", LOOPBACK, "--port", "0", "--webui-port", "0"]
    started = [
        start_managed("spark-master", _launch(master_args, log_path, "ALIVE", workdir), log_path)
    ]
    try:
        url = _master_url(log_path)
        for number in range(workers):
            worker_log = workdir / f"worker-{number}.log"
            args = [WORKER_CLASS, "--host", LOOPBACK, "--cores", str(cores), "--memory", memory]
            args += ["--webui-port", "0", "--work-dir", str(workdir / f"work-{number}")]
            launch = _launch(
                [*args, url], worker_log, "Successfully registered with master", workdir
            )
            started.append(start_managed(f"spark-worker-{number}", launch, worker_log))
    except BaseException:
        for process in reversed(started):
            process.stop()
        raise
    return started, url


def _master_url(log_path: Path) -> str:
    found = MASTER_URL.search(log_path.read_text(errors="replace"))
    if found is None:
        raise RuntimeError(f"the Spark master's log names no URL: {log_path}")
    return found.group(1)
