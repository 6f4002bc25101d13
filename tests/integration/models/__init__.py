"""Model repositories for tests that need Triton to behave in a particular way."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from recsys_tools.localstack import project_root

MODEL_NAME = "ranking_model"
# Production's queue policy (deploy/triton/gpu) with the local queue size. The local config
# leaves it off (it stalls this Triton's batcher, see its comment); the slow model is there
# to test how Triton sheds load with it.
QUEUE_POLICY = """  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 100000
    allow_timeout_override: true
    max_queue_size: 64
  }
"""


def _parameter(key: str, value: object) -> str:
    return f'parameters: {{\n  key: "{key}"\n  value: {{ string_value: "{value}" }}\n}}\n'


def _slow_config(
    delay_ms: int, max_batch_size: int, delay_file: Path | None, queue_policy: bool
) -> str:
    """The real local config (inputs, outputs, batching) plus the queue policy and delay."""
    config = (project_root() / "model_repository" / MODEL_NAME / "config.pbtxt").read_text()
    config, replaced = re.subn(
        r"^max_batch_size: \d+$", f"max_batch_size: {max_batch_size}", config, flags=re.M
    )
    if replaced != 1:
        raise ValueError("the local ranking_model config has no single max_batch_size line")
    if queue_policy and not re.search(r"^\s*default_queue_policy", config, flags=re.M):
        config = config.replace("dynamic_batching {\n", "dynamic_batching {\n" + QUEUE_POLICY, 1)
    config += _parameter("delay_ms", delay_ms)
    if delay_file is not None:
        config += _parameter("delay_file", delay_file.resolve())
    return config


def slow_model_repository(
    target_dir: Path,
    model_onnx_path: Path,
    delay_ms: int,
    max_batch_size: int,
    delay_file: Path | None = None,
    queue_policy: bool = True,
) -> Path:
    """Write a repository whose ranking_model sleeps delay_ms per execution; returns its root.

    With `delay_file`, the delay is read from that file (ms) at every execution while the
    file exists, and is 0 while it does not. `queue_policy=False` leaves production's queue
    policy out (with it, Triton 2.51 holds queued requests up to 500 ms; see the config).

    Same name, input `features` [n, 121] FP32 and output `score` [n, 1] FP32 as the real
    model, and the same scores: it runs model_onnx_path through onnxruntime. Its dynamic
    batcher has production's queue policy (QUEUE_POLICY).
    """
    version = target_dir / MODEL_NAME / "1"
    version.mkdir(parents=True, exist_ok=True)
    config = _slow_config(delay_ms, max_batch_size, delay_file, queue_policy)
    (target_dir / MODEL_NAME / "config.pbtxt").write_text(config)
    shutil.copyfile(Path(__file__).with_name("slow_model.py"), version / "model.py")
    shutil.copyfile(model_onnx_path, version / "model.onnx")
    return target_dir
