"""Triton Python-backend model for tests: the ranking model, slowed by a fixed delay.

Written into a test repository as ranking_model/1/model.py (see slow_model_repository). It
scores model.onnx through onnxruntime as the real model does, so answers stay valid; each
execution (one dynamic batch, however many requests it merged) first sleeps `delay_ms` from
the config's parameters, which keeps Triton's queue busy for queue-policy and deadline tests.
With a `delay_file` parameter, the delay (ms) is read from that file at every execution
instead, while it exists: a test slows Triton down and speeds it up again while it runs.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]


def _parameter(config: dict[str, Any], key: str, default: str) -> str:
    value: str = config.get("parameters", {}).get(key, {}).get("string_value", default)
    return value


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.input_name: str = config["input"][0]["name"]
        self.output_names: list[str] = [output["name"] for output in config["output"]]
        self.delay_s = int(_parameter(config, "delay_ms", "0")) / 1000.0
        self.delay_file = _parameter(config, "delay_file", "")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(_parameter(config, "intra_op_num_threads", "1"))
        options.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.onnx_input: str = self.session.get_inputs()[0].name
        # As the real model: the config's first output is the file's first, others by name.
        self.onnx_outputs = [self.session.get_outputs()[0].name, *self.output_names[1:]]

    def _delay_s(self) -> float:
        if not self.delay_file:
            return self.delay_s
        try:
            with open(self.delay_file) as delay:
                return float(delay.read()) / 1000.0
        except (OSError, ValueError):
            return 0.0  # no file: fast again

    def execute(self, requests: list[Any]) -> list[Any]:
        time.sleep(self._delay_s())
        batches = [
            pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            for request in requests
        ]
        rows = np.concatenate(batches)
        answers = self.session.run(self.onnx_outputs, {self.onnx_input: rows})
        answers[0] = answers[0].reshape(-1, 1)
        answers = [np.ascontiguousarray(answer, dtype=np.float32) for answer in answers]
        bounds = np.cumsum([0, *(batch.shape[0] for batch in batches)])
        return [
            pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor(name, answer[a:b])
                    for name, answer in zip(self.output_names, answers, strict=True)
                ]
            )
            for a, b in itertools.pairwise(bounds)
        ]

    def finalize(self) -> None:
        self.session = None
